"""The service with ``backend="megatron"`` driven by the official ``tinker`` SDK: a full-weight
model on two megatron-core ranks (PP=2) that Ray places on the CPU over gloo, checked against
the torch-backed service on the same datums (a tiny Llama; one service of each per module).
The Megatron-backed service samples with vLLM, its engines placed by Ray on a CPU beside the
ranks (the last test, marked ``vllm``)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

tinker = pytest.importorskip("tinker")
torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")
pytest.importorskip("ray")

from envhub.trainer.megatron.rank_setup import SETUP_ENV  # noqa: E402
from envhub.trainer.service.megatron_training import LORA_REFUSED  # noqa: E402
from tests.trainer.service.serving import (  # noqa: E402
    Running,
    datums,
    full_weight_client,
    scored,
)

COMPAT = Path(__file__).resolve().parents[1] / "megatron" / "cpu_compat.py"
ADAM = {"learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8,
        "weight_decay": 0.01, "grad_clip_norm": 0.5}  # fmt: skip
"""The clip is below the first step's gradient norm, so clipping is compared too."""
BATCHES = [
    [([5, 17, 99, 4, 31], [7, 7, 2]), ([40, 41], [42, 43, 44, 45])],
    [([8, 9, 10, 11, 12, 13], [14])],
]
"""Two ``forward_backward`` calls' (prompt, completion) tokens: one ``optim_step`` applies
both, so the gradients must accumulate in the ranks."""


def batch(examples: list[tuple[list[int], list[int]]]) -> list[Any]:
    """Datums of ``examples`` for ``importance_sampling``: completion tokens weighed by
    advantages, the sampler's logprobs a little off the model's."""
    out = []
    for prompt, completion in examples:
        full = prompt + completion
        n = len(full) - 1
        advantages = [0.0] * (len(prompt) - 1) + [0.5, -1.0, 1.5, 0.25][: len(completion)] * 2
        out.append(tinker.types.Datum(
            model_input=tinker.types.ModelInput.from_ints(full[:-1]),
            loss_fn_inputs={"target_tokens": full[1:], "advantages": advantages[:n],
                            "logprobs": [-11.0 - 0.1 * t for t in range(n)]},
        ))  # fmt: skip
    return out


@pytest.fixture(scope="module")
def services(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[dict[str, Running]]:  # fmt: skip
    """A torch-backed and a Megatron-backed service of the tiny Llama."""
    import ray

    saved = {k: os.environ.get(k) for k in (SETUP_ENV, "OMP_NUM_THREADS")}
    os.environ.update({SETUP_ENV: str(COMPAT), "OMP_NUM_THREADS": "1"})
    models = (f"tiny={tiny_model_dir}",)
    running = {
        "torch": Running(tmp_path_factory.mktemp("torch"), models=models),
        "megatron": Running(
            tmp_path_factory.mktemp("megatron"),
            models=models,
            backend="megatron",
            pipeline_parallel=2,
            sampler="vllm",  # engines start on the first sample only: other tests need no vLLM
        ),
    }
    yield running
    for service in running.values():
        service.stop()
    ray.shutdown()
    for key, value in saved.items():
        os.environ.pop(key, None) if value is None else os.environ.update({key: value})


def weights(service: Running, path: str) -> dict[str, Any]:
    """The tensors of the sampler weights saved at tinker ``path``."""
    from safetensors.torch import load_file

    run, kind, name = path.removeprefix("tinker://").split("/")
    return load_file(str(service.settings.state_dir / run / kind / name / "model.safetensors"))


def step(training: Any) -> dict[str, Any]:
    """Both batches' ``forward_backward``, one ``optim_step``; the losses, logprobs and the
    step's metrics."""
    results = [training.forward_backward(batch(b), "importance_sampling").result()
               for b in BATCHES]  # fmt: skip
    stepped = training.optim_step(tinker.types.AdamParams(**ADAM)).result()
    return {"losses": [r.metrics["loss:sum"] for r in results],
            "logprobs": [o["logprobs"].to_numpy() for r in results for o in r.loss_fn_outputs],
            "metrics": stepped.metrics}  # fmt: skip


@pytest.fixture(scope="module")
def trained(services: dict[str, Running]) -> dict[str, Any]:
    """One step on each service from the same weights: its results and the weights after."""
    out = {}
    for kind, service in services.items():
        client = service.client()
        training = full_weight_client(client, "tiny")
        result = step(training)
        result["training"], result["client"] = training, client
        saved = training.save_weights_for_sampler("step-1").result()
        result["weights"] = weights(service, saved.path)
        out[kind] = result
    return out


def test_a_step_on_megatron_matches_the_torch_service(trained: dict, tiny_model_dir: Path
                                                      ) -> None:  # fmt: skip
    from safetensors.torch import load_file

    ours, theirs = trained["megatron"], trained["torch"]
    assert ours["losses"] == pytest.approx(theirs["losses"], rel=1e-4)
    for a, b in zip(ours["logprobs"], theirs["logprobs"], strict=True):
        assert a == pytest.approx(b, abs=1e-5)
    assert theirs["metrics"]["grad_norm"] > ADAM["grad_clip_norm"]  # the clip was active
    assert ours["metrics"]["grad_norm"] == pytest.approx(theirs["metrics"]["grad_norm"], rel=1e-4)
    start = load_file(str(tiny_model_dir / "model.safetensors"))
    assert set(ours["weights"]) == set(start) - {"lm_head.weight"}  # tied: saved once, as HF does
    lr = ADAM["learning_rate"]
    for name, after in ours["weights"].items():
        mine, torchs = after - start[name], theirs["weights"][name] - start[name]
        # as tests/trainer/megatron/test_worker.py: Adam turns fp32 summation-order noise in
        # near-zero gradients into elements a few % of lr apart; the update as a whole agrees
        assert (mine - torchs).norm() < 2e-3 * torchs.norm(), name  # 3.4e-4 seen
        assert (mine - torchs).abs().max() < 0.05 * lr, name  # 0.031 seen: a first step is
        # about lr * sign(g), so a gradient within fp32 noise of 0 may land anywhere in +-lr
        assert torchs.abs().max() > 0.5 * lr, name  # every tensor moved


def test_lora_is_refused_with_the_reason(services: dict[str, Running]) -> None:
    client = services["megatron"].client()
    with pytest.raises(tinker.RequestFailedError) as refused:
        client.create_lora_training_client(base_model="tiny", rank=4).result()
    assert LORA_REFUSED in str(refused.value)
    assert refused.value.category == tinker.types.RequestErrorCategory.User


@pytest.mark.filterwarnings("ignore:DEPRECATED. TrainingClient.load_state:FutureWarning")
def test_a_saved_state_loads_back_with_its_optimizer(services: dict[str, Running],
                                                     trained: dict) -> None:  # fmt: skip
    """``save_state`` after the first step; a second step; ``load_state_with_optimizer`` and
    the second step again: the same weights and metrics (Adam's moments came back too). Loaded
    without the optimizer, the same gradients take another step (fresh moments)."""
    service, training = services["megatron"], trained["megatron"]["training"]
    state = training.save_state("after-1").result()
    second = step(training)
    expected = weights(service, training.save_weights_for_sampler("step-2").result().path)
    training.load_state_with_optimizer(state.path).result()
    loaded = weights(service, training.save_weights_for_sampler("loaded").result().path)
    for name, tensor in trained["megatron"]["weights"].items():
        assert torch.equal(loaded[name], tensor), name
    again = step(training)
    assert again["metrics"] == second["metrics"]
    assert again["losses"] == second["losses"]
    resumed = weights(service, training.save_weights_for_sampler("again").result().path)
    for name, tensor in expected.items():
        assert torch.equal(resumed[name], tensor), name
    training.load_state(state.path).result()
    fresh = step(training)
    assert fresh["losses"] == second["losses"]
    assert fresh["metrics"]["grad_norm"] == pytest.approx(second["metrics"]["grad_norm"], rel=1e-6)
    moved = weights(service, training.save_weights_for_sampler("fresh").result().path)
    assert not torch.equal(moved["model.layers.0.mlp.up_proj.weight"],
                           expected["model.layers.0.mlp.up_proj.weight"])  # fmt: skip


AGREE = 2e-4
"""Largest |vLLM - trainer| logprob difference of a token (as test_vllm_full_weights.py)."""
PROMPT = [1, 504, 3458, 314, 216, 28, 30, 1145]
SEEDED = tinker.types.SamplingParams(max_tokens=8, temperature=1.0, seed=5)


def _pids_named(title: bytes) -> set[int]:
    """Processes whose command line holds ``title`` (Ray names its actors' processes)."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and title in (entry / "cmdline").read_bytes():
                found.add(int(entry.name))
        except OSError:
            continue
    return found


@pytest.mark.vllm
def test_a_ray_placed_engine_samples_as_the_trainer_and_ray_outlives_sessions(
    require_vllm: None, services: dict[str, Running], trained: dict
) -> None:
    """A second session's full-weight model trains a step, saves and samples through a vLLM
    engine that Ray placed on this node: the trainer's logprobs. The first session, whose model
    was the first on Ray, ends (its ranks go): Ray, the engine and the second session's model
    go on. The service's stop leaves no engine, actor or rank."""
    import ray

    from envhub.lifetime.procs import group_members
    from envhub.trainer.engines.vllm_ray import PlacedServer

    service = services["megatron"]
    state = service.app.app.state.service
    client = service.client()
    training = full_weight_client(client, "tiny")
    training.forward_backward(datums([(PROMPT[:4], PROMPT[4:])]), "cross_entropy").result()
    training.optim_step(tinker.types.AdamParams(learning_rate=2e-2)).result()
    path = training.save_weights_for_sampler("ray-v1").result().path
    prompt = tinker.types.ModelInput.from_ints(PROMPT)
    sampler = client.create_sampling_client(model_path=path).result()
    first = sampler.sample(prompt, 2, SEEDED).result()
    for sequence in first.sequences:
        trainer = scored(training, PROMPT, sequence.tokens)[len(PROMPT) - 1 :]
        assert sequence.logprobs == pytest.approx(trainer, abs=AGREE)
    (found,) = state.samplers.full_weights.engines.values()
    server = found.engine.server
    assert isinstance(server, PlacedServer)
    assert server.host["node_id"] == ray.get_runtime_context().get_node_id()
    ranks = [r["pid"] for m in state.models.values() for r in m.backend.group.ranks_info()]
    trained["megatron"]["client"].close("success").result()  # its ranks go; Ray stays
    assert ray.is_initialized() and len(state.models) == 1
    training.forward_backward(datums([(PROMPT[:4], PROMPT[4:])]), "cross_entropy").result()
    again = sampler.sample(prompt, 2, SEEDED).result()  # the same engine, the same version
    assert [s.tokens for s in again.sequences] == [s.tokens for s in first.sequences]
    assert list(state.samplers.full_weights.engines.values()) == [found]  # not restarted
    hosts, owned, vllm = _pids_named(b"ray::EngineHost"), state.owns_ray, server.host["pid"]
    assert len(hosts) == 1
    service.stop()
    assert ray.is_initialized() is not owned  # stopped with the service only if it started it
    _wait_gone([vllm, *hosts, *ranks, *group_members(vllm)])
    print(f"Ray-placed engine start {state.samplers.full_weights.start_seconds[0]:.1f} s")


def _wait_gone(pids: list[int]) -> None:
    """Wait up to 30 s for ``pids`` to exit (Ray kills its actors asynchronously)."""
    deadline = time.monotonic() + 30
    while (left := [p for p in pids if _running(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == [], f"still running: {left}"


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        return not Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except OSError:
        return False
