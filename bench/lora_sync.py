"""A LoRA run's weight sync and generation with vLLM: the adapter alone (``lora_sync:
adapter``) against the merged model (``merged``), side by side on the same machine.

SmolLM2-135M-Instruct with a rank-16 all-linear adapter, the torch backend, vLLM in server
mode: seconds and megabytes per sync (verified), and seconds to generate ``--requests``
completions of up to ``--tokens`` tokens, 8 at once, after the sync (and tokens/s).

    .venv/bin/python bench/lora_sync.py [--syncs 3] [--requests 16] [--tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from envhub.inference.base import GenerateRequest, SamplingParams
from envhub.trainer.config import validate_config


def _config(lora_sync: str) -> Any:
    return validate_config({
        "model": {"name": "smollm2-135m", "lora": {"rank": 16, "alpha": 32}},
        "envs": [{"name": "arithmetic"}],
        "rollout": {"engine": "vllm", "vllm": {"kv_cache_gb": 1, "lora_sync": lora_sync}},
        "backend": {"device": "cpu"},
    })  # fmt: skip


async def measure(lora_sync: str, syncs: int, requests: int, tokens: int) -> dict[str, float]:
    """Median sync seconds and megabytes, and generation seconds, for one ``lora_sync``."""
    import torch  # noqa: TID251 - a script outside the package; it runs torch

    from envhub.trainer.backends.torch_backend import TorchBackend
    from envhub.trainer.engines.vllm import make_vllm_engine

    config = _config(lora_sync)
    backend = TorchBackend(config)
    engine = make_vllm_engine(config, backend)
    await engine.start()
    try:
        seconds, megabytes = [], []
        generator = torch.Generator().manual_seed(0)
        for _ in range(syncs):
            with torch.no_grad():  # a step's change to the adapter
                for name, p in backend.model.named_parameters():
                    if "lora_" in name:
                        p.add_(torch.randn(p.shape, generator=generator) * 0.01)
            metrics = await engine.update_weights(backend)
            seconds.append(metrics["sync/seconds"])
            megabytes.append(metrics["sync/megabytes"])
        gate = asyncio.Semaphore(8)
        sampling = SamplingParams(temperature=1.0, max_tokens=tokens)

        async def one(i: int) -> None:
            async with gate:
                prompt = list(range(1000 + i, 1032 + i))
                await engine.generate(
                    GenerateRequest(messages=[], prompt_ids=prompt, sampling=sampling)
                )

        engine.reset_stats()
        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(requests)))
        generation = time.perf_counter() - started
        generated = engine.stats()["generated_tokens"]
    finally:
        await engine.aclose()
    return {
        "sync_s": statistics.median(seconds),
        "sync_mb": statistics.median(megabytes),
        "generate_s": generation,
        "tokens_per_s": generated / generation,
    }


def main() -> None:
    """Measure both ways and print them side by side."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--syncs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    rows = {
        way: asyncio.run(measure(way, args.syncs, args.requests, args.tokens))
        for way in ("merged", "adapter")
    }
    print(f"{'lora_sync':10} {'sync s':>8} {'sync MB':>9} {'generate s':>11} {'tokens/s':>9}")
    for way, row in rows.items():
        print(
            f"{way:10} {row['sync_s']:8.3f} {row['sync_mb']:9.1f} {row['generate_s']:11.1f} "
            f"{row['tokens_per_s']:9.1f}"
        )


if __name__ == "__main__":
    main()
