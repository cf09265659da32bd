"""The torch backend's optimizer update on one GPU, packed and padded: training tokens/s, model
TFLOP/s and MFU, peak memory, and (``--profile``) the device's busy time against the wall time.

The update alone (forward, backward and the optimizer step over every micro-batch, what
``envhub train`` runs per update), without rollouts, so the numbers compare with
``bench/megatron_throughput.py``'s on the same shapes and batch: a randomly initialised Qwen2.5
shape (``--shape``), random sequences of ``--seq``/2 to ``--seq`` tokens, ``--tokens`` in all,
in micro-batches of ``--micro-batch-tokens`` (packed: one row each; padded: rows of the
longest). fp32 master weights under bf16 autocast on a GPU, fp32 on the CPU. ``--trace-syncs``
counts the call sites of one more update's host-device syncs (megatron_throughput's).
``--compile`` and ``--micro-batch-tokens auto`` are megatron_throughput's (``backend.compile``,
the memory-sized micro-batch); each layout's ``SUMMARY ...`` line holds its numbers for
``bench/gpu_checks.sh``.

Model FLOPs: megatron_throughput's count (6 x matmul parameters per token plus causal attention;
no recomputation counted). MFU divides the achieved FLOP/s by ``--peak-tflops``.

    python bench/torch_update.py --shape qwen2.5-0.5b --tokenizer DIR          # a GPU
    .venv/bin/python bench/torch_update.py --shape tiny --tokenizer DIR --tokens 2048 \\
        --seq 256 --micro-batch-tokens 512 --steps 1                        # CPU check
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from megatron_throughput import (
    COMPILE_CHOICES,
    H100_BF16_TFLOPS,
    SHAPES,
    budget_arg,
    diagnose,
    make_batch,
    make_model,
    model_flops,
)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def make_backend(model: Path, packing: str, args: argparse.Namespace):  # noqa: ANN201
    """The torch backend on ``model`` with ``packing`` (``packed`` or ``padded``)."""
    from envhub.trainer.backends.torch_backend import TorchBackend
    from envhub.trainer.config import validate_config

    config = {
        "model": {"name": str(model), "gradient_checkpointing": args.recompute},
        "envs": [{"name": "arithmetic"}],
        "backend": {
            "device": args.device,
            "packing": packing,
            "micro_batch_tokens": args.micro_batch_tokens,
            "compile": {
                "logprobs": args.compile in ("logprobs", "both"),
                "layers": args.compile in ("layers", "both"),
            },
        },
    }
    return TorchBackend(validate_config(config))


def run_variant(model: Path, packing: str, args: argparse.Namespace) -> dict:
    """Time ``args.steps`` updates (after one to warm up) of one layout; profile one more."""
    from envhub.trainer.algorithms import ObjectiveSpec
    from envhub.trainer.backends.compiled_layers import compile_seconds

    backend = make_backend(model, packing, args)
    gpu = backend.device.type == "cuda"
    batch, _ = make_batch(args.shape, args.tokens, args.seq, backend.micro_batch_tokens)
    compiled_before = compile_seconds()
    batches = backend.micro_batches(batch)

    def update() -> None:
        backend.update(
            batches,
            ObjectiveSpec(),
            old_logprobs=None,
            ref_logprobs=None,
            num_tokens=batch.num_tokens,
            num_sequences=batch.num_sequences,
        )

    def timed() -> float:
        if gpu:
            torch.cuda.synchronize()
        start = time.perf_counter()
        update()
        if gpu:
            torch.cuda.synchronize()
        return time.perf_counter() - start

    if gpu:
        torch.cuda.reset_peak_memory_stats()
    first, *seconds = [timed() for _ in range(args.steps + 1)]  # the first compiles
    memory = torch.cuda.max_memory_allocated() / 2**30 if gpu else 0.0
    profiled = diagnose(update, gpu, args)
    lengths = [len(s) for s in batch.samples]
    update_s = statistics.median(seconds)
    tflops = model_flops(args.shape, lengths) / update_s / 1e12
    result = {
        "packing": packing,
        "device": torch.cuda.get_device_name() if gpu else "cpu",
        "micro_batches": len(batches),
        "tokens": sum(lengths),
        "update_s": update_s,
        "tokens_per_s": sum(lengths) / update_s,
        "tflops": tflops,
        "mfu": tflops / args.peak_tflops if gpu else None,
        "peak_memory_gib": memory,
        "profile": profiled,
        "micro_batch_tokens": backend.micro_batch_tokens,
        "first_update_s": first,
        "compile_s": compile_seconds() - compiled_before,
    }
    return result


def print_table(results: list[dict], args: argparse.Namespace) -> None:
    """The layouts side by side, then each one's profile."""
    print(
        f"{args.shape} on {results[0]['device']}: {results[0]['tokens']} tokens per update, "
        f"micro-batches of <= {results[0]['micro_batch_tokens']} tokens, "
        f"recompute={args.recompute}, compile={args.compile}"
    )
    rows = [
        ("micro-batches", lambda r: f"{r['micro_batches']}"),
        ("update s (median)", lambda r: f"{r['update_s']:.3f}"),
        ("training tokens/s", lambda r: f"{r['tokens_per_s']:,.0f}"),
        ("model TFLOP/s", lambda r: f"{r['tflops']:.3g}"),
        ("MFU", lambda r: f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a (CPU)"),
        ("peak memory GiB", lambda r: f"{r['peak_memory_gib']:.1f}"),
        ("first update s", lambda r: f"{r['first_update_s']:.2f}"),
        ("torch.compile s", lambda r: f"{r['compile_s']:.1f}"),
    ]
    print(f"{'':<20}" + "".join(f"{r['packing']:>14}" for r in results))
    for name, cell in rows:
        print(f"{name:<20}" + "".join(f"{cell(r):>14}" for r in results))
    for r in results:
        if r["profile"]:
            print(f"--- {r['packing']}\n{r['profile']}")
    for r in results:
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
        print(
            f"SUMMARY {args.shape} {r['packing']} mb={r['micro_batch_tokens']} "
            f"compile={args.compile} recompute={args.recompute} "
            f"tokens/s={r['tokens_per_s']:,.0f} mfu={mfu} update_s={r['update_s']:.3f} "
            f"first_s={r['first_update_s']:.1f} compile_s={r['compile_s']:.1f} "
            f"mem_gib={r['peak_memory_gib']:.1f}"
        )


def main() -> None:
    """Save the model once, run each layout on it, print the table (and ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    parser.add_argument("--tokenizer", required=True, help="a tokenizer folder (SmolLM2's)")
    parser.add_argument("--variants", default="packed,padded")
    parser.add_argument("--tokens", type=int, default=32768, help="tokens per update")
    parser.add_argument("--seq", type=int, default=2048, help="longest sequence")
    parser.add_argument("--micro-batch-tokens", type=budget_arg, default=4096, help="or auto")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--compile", choices=COMPILE_CHOICES, default="off")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--recompute", action="store_true", help="gradient checkpointing")
    parser.add_argument("--profile", action="store_true", help="profile one more update")
    parser.add_argument(
        "--trace-syncs", action="store_true", help="count one more update's sync call sites"
    )
    parser.add_argument("--peak-tflops", type=float, default=H100_BF16_TFLOPS)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / args.shape
        make_model(model, args.shape)
        for name in TOKENIZER_FILES:  # ids stay below the shape's vocabulary: no decoding
            if (Path(args.tokenizer) / name).exists():
                shutil.copy(Path(args.tokenizer) / name, model / name)
        results = []
        for variant in args.variants.split(","):
            results.append(run_variant(model, variant, args))
            if torch.cuda.is_available():  # the last layout's model and optimizer are gone
                torch.cuda.empty_cache()
    print_table(results, args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
