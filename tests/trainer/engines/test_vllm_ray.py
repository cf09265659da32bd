"""A vLLM server placed by Ray (``rollout.vllm.mode: ray``), on a real local Ray cluster: where
the engine's actor goes, and how a failed start or a dead actor is reported. The whole training
path (split and colocated, weight syncs verified) runs in ``tests/e2e/test_train_megatron.py``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

ray = pytest.importorskip("ray")

from envhub.errors import EngineError, EngineUnavailableError  # noqa: E402
from envhub.trainer.cluster.ray_runtime import LOCAL_SYSTEM_CONFIG  # noqa: E402
from envhub.trainer.engines.vllm_ray import (  # noqa: E402
    COLOCATED_GPU_SHARE,
    EngineSlot,
    HostedProcess,
    RayServerTransport,
    engine_slot,
)
from envhub.trainer.engines.vllm_transport import EngineSettings  # noqa: E402


def _settings(model: str) -> EngineSettings:
    return EngineSettings(
        model=model, dtype="float32", max_model_len=256, seed=0, weight_transfer="envhub_shm",
        gpu_memory_utilization=0.4, kv_cache_gb=1, sleep=False, max_concurrency=4,
        startup_timeout=120, on_gpu=False, enforce_eager=True,
    )  # fmt: skip


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, _system_config=LOCAL_SYSTEM_CONFIG)
    yield
    ray.shutdown()


def _free_cpus(expected: float) -> float:
    """Free CPUs once they reach ``expected`` (Ray frees them asynchronously), or after 20 s."""
    deadline = time.monotonic() + 20
    while (
        free := ray.available_resources().get("CPU", 0.0)
    ) != expected and time.monotonic() < deadline:
        time.sleep(0.2)
    return free


def _wait_until_dead(actor: object) -> None:
    """Wait until a killed ``actor`` stops answering; fail if it still answers after 30 s.

    Ray kills an actor asynchronously: a call made right after ``ray.kill`` can still be answered.
    """
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            ray.get(actor.exit_code.remote(), timeout=30)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.2)
    raise AssertionError("the killed actor still answered after 30 s")


def test_the_slot_follows_the_placement_settings() -> None:
    def config(**vllm: object) -> SimpleNamespace:
        return SimpleNamespace(
            rollout=SimpleNamespace(
                vllm=SimpleNamespace(**{"colocate": False, "tensor_parallel": 2} | vllm)
            )
        )

    gpu, cpu = (
        SimpleNamespace(device=SimpleNamespace(type="cuda")),
        SimpleNamespace(device=SimpleNamespace(type="cpu")),
    )
    assert engine_slot(config(), gpu) == EngineSlot(num_cpus=1, num_gpus=2)
    assert engine_slot(config(), cpu) == EngineSlot(num_cpus=1, num_gpus=0)
    trainer = SimpleNamespace(
        device=SimpleNamespace(type="cuda"), group=SimpleNamespace(placement_group="pg")
    )
    assert engine_slot(config(colocate=True), trainer) == EngineSlot(
        num_cpus=0, num_gpus=COLOCATED_GPU_SHARE, placement_group="pg", bundle_index=0
    )
    with pytest.raises(EngineError, match="rollout.vllm.colocate needs trainer ranks on Ray"):
        engine_slot(config(colocate=True), gpu)


@pytest.mark.vllm
def test_a_server_that_cannot_start_is_reported_with_its_node_and_log(
    require_vllm, cluster: None, tmp_path: Path
) -> None:
    transport = RayServerTransport(
        _settings(str(tmp_path / "no-such-model")), EngineSlot(num_cpus=1)
    )
    with pytest.raises(EngineUnavailableError) as caught:
        asyncio.run(transport.start())
    message = str(caught.value)
    assert message.startswith(
        f"the vLLM engine on node {ray.util.get_node_ip_address()} failed to start: "
    )
    model = str(tmp_path / "no-such-model")
    assert f"model {model!r} is not on this machine and could not be downloaded — " in message
    assert message.endswith(".log)") and "(vLLM's full log: " in message
    asyncio.run(transport.aclose())
    assert transport.placed.actor is None and transport.placed.own_group is None
    assert _free_cpus(2.0) == 2.0  # the actor and its bundle were given back


def test_a_dead_engine_actor_is_reported_as_unavailable(cluster: None, tmp_path: Path) -> None:
    transport = RayServerTransport(_settings(str(tmp_path)), EngineSlot(num_cpus=1))
    transport.placed.place()  # the actor only: its server is never started
    assert (
        transport.placed.host["node_ip"] == ray.util.get_node_ip_address()
        and transport.placed.host["pid"] is None
    )
    assert ray.get(transport.placed.actor.exit_code.remote()) is None
    # as the service's vLLM sampler sees its placed engine's process: running, then dead
    process = HostedProcess(transport.placed.actor, pid=0)
    assert process.poll() is None
    assert _free_cpus(1.0) == 1.0
    ray.kill(transport.placed.actor, no_restart=True)
    _wait_until_dead(transport.placed.actor)
    assert process.poll() == -9
    with pytest.raises(
        EngineUnavailableError,
        match=rf"^the vLLM engine's Ray actor \(node {ray.util.get_node_ip_address()}\) died: ",
    ):
        transport._raise_if_exited()
    asyncio.run(transport._shutdown())
    assert _free_cpus(2.0) == 2.0
