"""vLLM vs the HF engine as the trainer's rollout engine, and what weight sync costs.

Part 1, generation: SmolLM2-135M-Instruct (float32 on both sides), the same 64 chat prompts,
up to 128 new tokens each at temperature 1, all sent at once through the ``InferenceEngine`` API
(what the rollout runner does). Tokens/s counts the tokens actually generated.

Part 2, training: ``envhub train examples/quickstart.yaml`` with ``rollout.engine=vllm`` for a
few steps; from its metrics, per step: rollout tokens/s, weight-sync seconds and their share of
the step, and the logprob mismatch on the fixed verification sequence before the sync (how far
vLLM's policy lagged the trainer's) and after it.

    .venv/bin/python bench/vllm_rollout.py [--prompts 64] [--new-tokens 128] [--steps 4] \
        [--skip-train]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from envhub.inference.base import GenerateRequest, SamplingParams
from envhub.trainer.config import validate_config
from envhub.types import user

ROOT = Path(__file__).resolve().parents[1]
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


def requests(tokenizer, n: int, new_tokens: int) -> list[GenerateRequest]:
    """Build ``n`` story-writing chat requests, rendered to prompt ids with ``tokenizer``.

    Topics cycle through :data:`TOPICS` and each prompt carries its index, so no two prompts are
    the same. All requests sample at temperature 1 for up to ``new_tokens`` tokens.
    """
    sampling = SamplingParams(temperature=1.0, max_tokens=new_tokens)
    out = []
    for i in range(n):
        messages = [user(f"Write a long story about {TOPICS[i % len(TOPICS)]} (version {i}).")]
        out.append(
            GenerateRequest(
                messages=messages,
                prompt_ids=tokenizer.render_sync(messages, None, True),
                sampling=sampling,
            )
        )
    return out


async def timed(engine, batch: list[GenerateRequest]) -> tuple[int, float]:
    """Send every request in ``batch`` to ``engine`` at once.

    Returns:
        The number of tokens generated and the wall-clock seconds until the last one finished.
    """
    started = time.perf_counter()
    outs = await asyncio.gather(*(engine.generate(r) for r in batch))
    return sum(len(o.token_ids or ()) for o in outs), time.perf_counter() - started


def generation(prompts: int, new_tokens: int) -> None:
    """Part 1: print tokens/s of the HF engine and of a vLLM server on the same prompts.

    Both engines serve the torch backend's model; vLLM gets the trainer's weights first and a
    small warm-up batch that is not timed. vLLM's start-up time is printed on its own.
    """
    from envhub.trainer.backends.torch_backend import TorchBackend
    from envhub.trainer.engines.hf import HFEngine
    from envhub.trainer.engines.vllm import make_vllm_engine

    config = validate_config({
        "envs": [{"name": "arithmetic"}],
        "rollout": {"engine": "vllm", "max_concurrency": prompts},
        "backend": {"device": "cpu"},
    })  # fmt: skip
    backend = TorchBackend(config)
    hf = HFEngine(backend.model, backend.tokenizer, max_batch_size=prompts)
    batch = requests(hf.tokenizer, prompts, new_tokens)
    rows = []

    async def hf_run() -> tuple[int, float]:
        try:
            return await timed(hf, batch)
        finally:
            await hf.aclose()

    tokens, seconds = asyncio.run(hf_run())
    rows.append((f"HF engine (batch {prompts})", tokens, seconds))

    async def vllm_run() -> list[tuple[str, int, float]]:
        engine = make_vllm_engine(config, backend)
        started = time.perf_counter()
        async with engine:
            start_s = time.perf_counter() - started
            await engine.update_weights(backend)
            await timed(engine, batch[:8])  # vLLM's first batch is a slow warm-up
            tokens, seconds = await timed(engine, batch)
            print(f"vLLM start: {start_s:.1f} s (server, {engine.settings.dtype})")
            return [("vLLM server (2 cores bound)", tokens, seconds)]

    rows += asyncio.run(vllm_run())
    print(f"\n{prompts} prompts x <= {new_tokens} new tokens, T=1, SmolLM2-135M fp32, 2 cores")
    print(f"{'engine':32} {'tokens':>7} {'seconds':>8} {'tokens/s':>9}")
    for name, tokens, seconds in rows:
        print(f"{name:32} {tokens:7d} {seconds:8.1f} {tokens / seconds:9.1f}")
    print(f"vLLM / HF: {(rows[1][1] / rows[1][2]) / (rows[0][1] / rows[0][2]):.2f}x")


def training(steps: int) -> None:
    """Part 2: run ``envhub train`` on the quickstart with vLLM and print its per-step metrics.

    The run is a subprocess writing to a temporary directory, without checkpoints, export or
    plot. The table shows rollout throughput, weight-sync time and share of the step, and the
    logprob differences between vLLM and the trainer before and after each sync.
    """
    out = Path(tempfile.mkdtemp(prefix="envhub-bench-vllm-"))
    command = [
        str(Path(sys.executable).parent / "envhub"), "train",
        str(ROOT / "examples" / "quickstart.yaml"),
        "rollout.engine=vllm", f"steps={steps}", f"logging.output_dir={out}",
        "logging.run_name=vllm", "checkpoint.resume=never", "checkpoint.every=1000",
        "checkpoint.export_hf=false", "logging.plot=false",
    ]  # fmt: skip
    started = time.perf_counter()
    try:
        subprocess.run(command, check=True)
        wall = time.perf_counter() - started
        metrics = (out / "vllm" / "metrics.jsonl").read_text()
    finally:
        shutil.rmtree(out, ignore_errors=True)
    rows = [json.loads(line) for line in metrics.splitlines()]
    print(
        f"\nenvhub train quickstart, rollout.engine=vllm, {steps} steps, "
        f"{wall:.0f} s wall (with engine start)"
    )
    print(
        f"{'step':>4} {'reward':>7} {'rollout s':>9} {'tok/s':>7} {'update s':>8} {'sync s':>7} "
        f"{'sync %':>7} {'Δlp before':>11} {'Δlp after':>10} {'TIS Δlp max':>11}"
    )
    for r in rows:
        share = 100 * r["time/sync"] / r["time/step"]
        stale = r.get("sync/stale_logprob_diff_max", float("nan"))
        mismatch = r.get("train/mismatch_abs_logprob_diff_max", float("nan"))
        print(
            f"{r['step']:4d} {r['reward/mean']:7.3f} {r['time/rollout']:9.2f} "
            f"{r['throughput/rollout_tokens_per_s']:7.1f} {r.get('time/update', 0.0):8.2f} "
            f"{r['sync/seconds']:7.2f} {share:6.1f}% {stale:11.2e} "
            f"{r['sync/logprob_diff_max']:10.2e} {mismatch:11.2e}"
        )
    median_sync = statistics.median(r["sync/seconds"] for r in rows)
    median_share = statistics.median(100 * r["time/sync"] / r["time/step"] for r in rows)
    print(f"median sync: {median_sync:.2f} s, {median_share:.1f}% of the step")


def main() -> None:
    """Run part 1 (generation), then part 2 (training) unless ``--skip-train`` is given."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--skip-train", action="store_true")
    args = parser.parse_args()
    generation(args.prompts, args.new_tokens)
    if not args.skip_train:
        training(args.steps)


if __name__ == "__main__":
    main()
