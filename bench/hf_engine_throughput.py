"""Tokens/s of :class:`HFEngine` with SmolLM2-135M-Instruct, by batch size, against a bare
``model.generate`` call on the same prompts (the engine's overhead: queueing, the logprob hook,
cutting and decoding rows).

32 chat prompts, up to 64 new tokens each, sampled at temperature 1; all 32 requests are sent at
once and ``max_batch_size`` splits them into batches of 1, 8 or 32. A row that samples EOS early
stops early, so tokens/s counts the tokens actually generated.

    .venv/bin/python bench/hf_engine_throughput.py [--prompts 32] [--new-tokens 64] \
        [--batch-sizes 1 8 32]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import torch  # noqa: TID251 - a script outside the package; it needs torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from envhub.inference.base import GenerateRequest, SamplingParams
from envhub.trainer.engines import HFEngine
from envhub.trainer.models import resolve_model
from envhub.types import user

TOPICS = [
    "the sea",
    "a city at night",
    "bread",
    "the moon",
    "trains",
    "winter",
    "a library",
    "rivers",
]


def requests(engine: HFEngine, n: int, new_tokens: int) -> list[GenerateRequest]:
    """Build ``n`` story-writing chat requests, tokenized with the engine's chat template.

    Topics cycle through :data:`TOPICS` and each prompt carries its index, so no two prompts are
    the same. All requests sample at temperature 1 for up to ``new_tokens`` tokens.

    Returns:
        The requests, with ``prompt_ids`` already filled in so both the engine and the bare
        ``model.generate`` baseline see the same token ids.
    """
    sampling = SamplingParams(temperature=1.0, max_tokens=new_tokens)
    out = []
    for i in range(n):
        messages = [user(f"Write a long story about {TOPICS[i % len(TOPICS)]} (version {i}).")]
        ids = engine.tokenizer.render_sync(messages, None, True)
        out.append(GenerateRequest(messages=messages, prompt_ids=ids, sampling=sampling))
    return out


def run_engine(engine: HFEngine, batch: list[GenerateRequest]) -> tuple[int, float]:
    """Send every request in ``batch`` to ``engine`` at once and wait for all of them.

    The engine's stats are reset first, and its batching task is stopped at the end because it
    belongs to this call's event loop.

    Returns:
        The number of tokens the engine generated and the wall-clock seconds it took.
    """

    async def main() -> None:
        try:
            await asyncio.gather(*(engine.generate(r) for r in batch))
        finally:
            await engine.aclose()

    engine.reset_stats()
    started = time.perf_counter()
    asyncio.run(main())
    return engine.generated_tokens, time.perf_counter() - started


def run_bare(
    model: torch.nn.Module,
    tokenizer: object,
    batch: list[GenerateRequest],
    size: int,
    new_tokens: int,
) -> tuple[int, float]:
    """The same prompts through ``model.generate`` directly, ``size`` at a time."""
    pad = tokenizer.pad_token_id  # type: ignore[attr-defined]
    tokens, started = 0, time.perf_counter()
    for start in range(0, len(batch), size):
        prompts = [r.prompt_ids or [] for r in batch[start : start + size]]
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=new_tokens,
                do_sample=True,
                top_k=0,
                pad_token_id=pad,
            )
        for row in out[:, width:].tolist():
            tokens += next((i + 1 for i, t in enumerate(row) if t == pad), len(row))
    return tokens, time.perf_counter() - started


def main() -> None:
    """Parse the arguments, load the model, and print engine vs bare tokens/s per batch size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    args = parser.parse_args()
    path = resolve_model("smollm2-135m")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    print(
        f"SmolLM2-135M-Instruct fp32, {torch.get_num_threads()} threads, "
        f"{args.prompts} prompts x <= {args.new_tokens} new tokens",
        flush=True,
    )
    warm = HFEngine(model, tokenizer)
    run_engine(warm, requests(warm, 2, 4))  # first-call costs (kernels, allocator) out of the way
    print(f"{'batch':>5} {'engine tok/s':>13} {'tokens':>7} {'bare generate tok/s':>20}")
    for size in args.batch_sizes:
        engine = HFEngine(model, tokenizer, max_batch_size=size, seed=0)
        batch = requests(engine, args.prompts, args.new_tokens)
        tokens, seconds = run_engine(engine, batch)
        torch.manual_seed(0)
        bare_tokens, bare_seconds = run_bare(model, tokenizer, batch, size, args.new_tokens)
        print(
            f"{size:>5} {tokens / seconds:>13.1f} {tokens:>7} {bare_tokens / bare_seconds:>20.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
