"""The Megatron critic on the CPU over gloo (real megatron-core and mbridge, 2 processes): its
values and two clipped value-loss updates under TP=2, PP=2 and DP=2 match the torch critic on
the same tiny model and batch, and its distributed checkpoint resumes to the same update; the
driver's ``MegatronCritic`` on Ray ranks answers the loop's calls as the torch critic does."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch

pytest.importorskip("megatron.core")
pytest.importorskip("mbridge")

from envhub.trainer.config import validate_config  # noqa: E402
from envhub.trainer.critic.torch_critic import TorchCritic  # noqa: E402

HERE = Path(__file__).resolve().parent


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"megatron_{name}", HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


critic_main = _load("critic_main")
LAYOUTS = {"tp2": (2, 1), "pp2": (1, 2), "dp2": (1, 1)}


def _torch_critic(model_dir: Path, **critic: object) -> TorchCritic:
    o = critic_main.OPTIMIZER
    config = validate_config({
        "model": {"name": str(model_dir)}, "envs": [{"name": "arithmetic"}],
        "algorithm": {"advantage": "gae", "dynamic_sampling": False},
        "critic": {"lr": o["lr"], "grad_clip": o["grad_clip"], "weight_decay": o["weight_decay"],
                   "value_clip": critic_main.VALUE_CLIP, **critic},
    })  # fmt: skip
    return TorchCritic(config, torch.device("cpu"), None)


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> dict:
    """The torch critic on the same batch: values, two updates, values after."""
    critic = _torch_critic(tiny_model_dir)
    b = critic_main.critic_batch()
    sequences = [s.token_ids for s in b.samples]
    before = critic.values(sequences)
    metrics = [critic.update(b.samples) for _ in range(2)]
    return {"values": before, "metrics": metrics, "values_after": critic.values(sequences)}


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def ranks(
    request: pytest.FixtureRequest,
    tiny_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    run_torchrun: Callable[..., None],
) -> list[dict]:
    tp, pp = LAYOUTS[request.param]
    out = tmp_path_factory.mktemp(f"critic-{request.param}")
    run_torchrun("critic_main.py", [str(tiny_model_dir), str(out), str(tp), str(pp)], world=2)
    return [torch.load(out / f"critic-rank-{r}.pt") for r in range(2)]


def _per_sequence(ranks: list[dict], key: str) -> list[torch.Tensor]:
    """The ranks' values of each micro-batch, as one tensor per sequence of the batch."""
    merged: dict[int, torch.Tensor] = {}
    for r in ranks:
        merged |= r[key] or {}
    b = critic_main.critic_batch()
    mbs = critic_main.packed(b)
    out: list[torch.Tensor] = [torch.empty(0)] * len(b.samples)
    for k, mb in enumerate(mbs):
        for row, i in enumerate(mb.samples):
            out[i] = merged[k][row, : len(b.samples[i]) - 1].double()
    return out


def test_a_new_critic_values_everything_at_zero(ranks: list[dict], reference: dict) -> None:
    for ours, theirs in zip(_per_sequence(ranks, "values"), reference["values"], strict=True):
        assert torch.equal(ours, torch.zeros_like(ours)) and torch.equal(theirs, ours)


def test_two_value_updates_match_the_torch_critic(ranks: list[dict], reference: dict) -> None:
    reports = [r["metrics"] for r in ranks if r["metrics"][0] is not None]
    assert len(reports) == 1  # one rank reports
    for ours, theirs in zip(reports[0], reference["metrics"], strict=True):
        assert ours["loss"] == pytest.approx(theirs["value_loss"], rel=1e-4, abs=1e-7)
        assert ours["error"] == pytest.approx(theirs["value_error"], rel=1e-4, abs=1e-7)
        assert ours["clip_frac"] == pytest.approx(theirs["value_clip_frac"], abs=1e-6)
        assert ours["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-4)
        assert ours["lr"] == theirs["lr"] == critic_main.OPTIMIZER["lr"]
    assert reports[0][0]["grad_norm"] > critic_main.OPTIMIZER["grad_clip"]  # clipping is compared
    assert reports[0][1]["clip_frac"] > 0  # and so is the clipped branch of the loss
    after = _per_sequence(ranks, "values_after")
    for ours, theirs in zip(after, reference["values_after"], strict=True):
        assert theirs.abs().max() > 0.01  # the values moved
        torch.testing.assert_close(ours, theirs, atol=2e-4, rtol=2e-3)


def test_the_critics_checkpoint_resumes_to_the_same_update(ranks: list[dict]) -> None:
    for r in ranks:
        assert r["metrics_resumed"] == r["metrics"][1]
    for ours, again in zip(
        _per_sequence(ranks, "values_after"), _per_sequence(ranks, "values_resumed"), strict=True
    ):
        assert torch.equal(ours, again)


def test_the_driver_runs_the_critic_on_ray_ranks_as_the_torch_critic(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``MegatronCritic`` on two Ray CPU ranks (PP=2): the loop's calls (values, update, a
    checkpoint through the manager) give what the torch critic gives."""
    import ray

    from envhub.trainer.checkpoint import CheckpointManager
    from envhub.trainer.megatron.critic import MegatronCritic
    from envhub.trainer.megatron.rank_setup import SETUP_ENV

    monkeypatch.setenv(SETUP_ENV, str(HERE / "cpu_compat.py"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    o = critic_main.OPTIMIZER
    config = validate_config({
        "model": {"name": str(tiny_model_dir)}, "envs": [{"name": "arithmetic"}],
        "rollout": {"engine": "vllm"}, "backend": {"kind": "megatron", "micro_batch_tokens": 20,
        "megatron": {"pipeline_parallel": 2}},
        "algorithm": {"advantage": "gae", "dynamic_sampling": False},
        "critic": {"lr": o["lr"], "grad_clip": o["grad_clip"], "weight_decay": o["weight_decay"],
                   "value_clip": critic_main.VALUE_CLIP},
    })  # fmt: skip
    b = critic_main.critic_batch()
    sequences = [s.token_ids for s in b.samples]
    torch_critic = _torch_critic(tiny_model_dir)
    expected = torch_critic.update(b.samples)
    critic = MegatronCritic(config, pad_id=0)
    try:
        assert all(torch.equal(v, torch.zeros_like(v)) for v in critic.values(sequences))
        got = critic.update(b.samples)
        for name in ("value_loss", "value_error", "grad_norm", "lr"):
            assert got[name] == pytest.approx(expected[name], rel=1e-4), name
        checkpoints = CheckpointManager(tmp_path / "checkpoints")
        policy = _NoPolicy()  # only the critic matters here
        folder = checkpoints.save(1, model=policy, trainer_state={}, critic=critic.state())
        after_one = [v.clone() for v in critic.values(sequences)]
        for ours, theirs in zip(after_one, torch_critic.values(sequences), strict=True):
            torch.testing.assert_close(ours, theirs, atol=2e-4, rtol=2e-3)
        critic.update(b.samples)
        checkpoints.load(folder, model=policy, critic=critic.state())
        for ours, saved in zip(critic.values(sequences), after_one, strict=True):
            assert torch.equal(ours, saved)
    finally:
        critic.close()
        ray.shutdown()


class _NoPolicy:
    """A policy with nothing to save (a ``ShardedModel`` that writes an empty folder)."""

    def save_checkpoint(self, folder: Path) -> None:
        Path(folder).mkdir(parents=True, exist_ok=True)

    def load_checkpoint(self, folder: Path) -> None:
        pass
