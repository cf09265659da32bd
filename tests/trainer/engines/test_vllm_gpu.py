"""The vLLM engine's GPU paths: CUDA IPC sync next to an in-process engine, NCCL sync to a
server, and sleep mode freeing GPU memory while the trainer updates. They run wherever a CUDA
GPU and a CUDA build of vLLM are present (never in CI, which has no GPU)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.vllm,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("require_vllm"),
]


@pytest.mark.parametrize(
    ("mode", "transfer"), [("inprocess", "ipc"), ("server", "nccl"), ("server", "envhub_shm")]
)
def test_gpu_sync_matches_the_trainer_and_sleep_frees_memory(
    tiny_model_dir: Path, mode: str, transfer: str
) -> None:
    from envhub.trainer.backends.torch_backend import TorchBackend
    from envhub.trainer.config import validate_config
    from envhub.trainer.engines.vllm import make_vllm_engine

    config = validate_config({
        "model": {"name": str(tiny_model_dir), "dtype": "float32"},
        "envs": [{"name": "arithmetic"}],
        "rollout": {"engine": "vllm", "vllm": {"mode": mode, "weight_transfer": transfer,
                                               "dtype": "float32", "gpu_memory_utilization": 0.3,
                                               "sleep": "on" if mode == "inprocess" else "off"}},
        "backend": {"device": "cuda"},
    })  # fmt: skip
    backend = TorchBackend(config)
    engine = make_vllm_engine(config, backend)

    async def scenario() -> tuple[dict[str, float], dict[str, float], int, int]:
        async with engine:
            first = await engine.update_weights(backend)
            free_awake = torch.cuda.mem_get_info()[0]
            await engine.sleep()
            free_asleep = torch.cuda.mem_get_info()[0]
            with torch.no_grad():
                for p in backend.model.parameters():
                    p.mul_(1.05)
            second = await engine.update_weights(backend)
            return first, second, free_awake, free_asleep

    first, second, free_awake, free_asleep = asyncio.run(scenario())

    assert first["sync/logprob_diff_max"] < 1e-3 and second["sync/logprob_diff_max"] < 1e-3
    assert second["sync/stale_logprob_diff_max"] > 1e-3
    if engine.settings.sleep:
        assert free_asleep > free_awake + (64 << 20)  # the KV cache and weights left the GPU
