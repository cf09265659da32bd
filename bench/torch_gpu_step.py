"""The torch backend on one GPU: seconds per GRPO step by phase, training tokens/s, the update's
model TFLOP/s and MFU, and peak memory, for a randomly initialised model of a real shape.

Each variant is a short ``envhub train`` run (``envhub.trainer.loop.train``, HF-engine rollouts
by the policy itself, bf16 autocast over fp32 master weights) on the arithmetic env: ``--tasks``
prompts x ``--samples`` samples of up to ``--max-tokens`` tokens, dynamic sampling and the
mismatch correction off, one update per step. A random model rarely stops early, so completions
run to ``--max-tokens``; the rewards are all 0 and the policy term's gradient is 0, which costs
the same forward and backward as a learning step. Variants: ``padded`` (the GPU default),
``packed`` (``backend.packing=packed``: one row per micro-batch, shared prompts run once),
``gc`` (padded + gradient checkpointing), ``lora`` (padded + a rank-16 adapter on every linear).

Model FLOP/s of the update: 6 x (matmul parameters, LM head included) x (the sum of the batch's
sequence lengths) / update seconds, attention left out. The count is the work of running every
sequence whole, so a layout that runs a shared prompt once scores above the hardware's FLOP/s
for the same work done; MFU divides it by ``--peak-tflops`` (dense bf16 of an H100/H200 SXM).

    python bench/torch_gpu_step.py --tokenizer DIR [--variants padded,packed,gc,lora]
    .venv/bin/python bench/torch_gpu_step.py --tokenizer DIR --device cpu --shape tiny \
        --tasks 2 --samples 2 --max-tokens 8          # check the script on a CPU
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from megatron_throughput import H100_BF16_TFLOPS, SHAPES

VARIANTS = {
    "padded": {},
    "packed": {"backend": {"packing": "packed"}},
    "gc": {"model": {"gradient_checkpointing": True}},
    "lora": {"model": {"lora": {"rank": 16}}},
}


def make_model(folder: Path, shape: str, tokenizer_dir: str) -> int:
    """Save a randomly initialised Qwen2 of ``shape`` with ``tokenizer_dir``'s tokenizer in
    ``folder``; return its matmul parameter count (tied LM head counted once more)."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    config = transformers.Qwen2Config(
        **{k: v for k, v in SHAPES[shape].items() if k != "vocab_size"},  # the tokenizer's
        vocab_size=len(tokenizer),
        tie_word_embeddings=True,
        max_position_embeddings=4096,
        rope_theta=1e6,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    layers = sum(p.numel() for n, p in model.named_parameters() if "proj" in n and p.dim() == 2)
    return layers + model.config.vocab_size * model.config.hidden_size


def run_config(model_dir: Path, output_dir: Path, variant: str, args: argparse.Namespace) -> Any:
    """The training config of one variant."""
    from envhub.trainer.config import validate_config

    steps = args.warmup + args.steps
    base: dict[str, Any] = {
        "steps": steps,
        "seed": 0,
        "model": {"name": str(model_dir), "dtype": "bfloat16"},
        "envs": [{"name": "arithmetic", "args": {"difficulty": "easy"}}],
        "rollout": {
            "tasks_per_step": args.tasks,
            "samples_per_task": args.samples,
            "max_tokens": args.max_tokens,
            "temperature": 1.0,
            "engine": "hf",
        },
        "algorithm": {
            "dynamic_sampling": False,
            "mismatch": "none",
            "kl_beta": 0.0,
            "max_empty_steps": None,  # a random model earns no reward: train on anyway
        },
        "backend": {"device": args.device, "micro_batch_tokens": args.micro_batch_tokens},
        "logging": {
            "output_dir": str(output_dir),
            "run_name": variant,
            "plot": False,
            "save_trajectories": False,
        },
        "checkpoint": {"every": steps + 1, "export_hf": False, "resume": "never"},
    }
    for part, values in VARIANTS[variant].items():
        base[part] = base.get(part, {}) | values
    return validate_config(base)


def run_variant(model_dir: Path, variant: str, matmul_params: int, args: argparse.Namespace):
    """Train one variant; return the medians of its timed steps and its peak memory."""
    from envhub.trainer.loop import train
    from envhub.trainer.tracking import read_metrics

    cuda = args.device.startswith("cuda")
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="envhub-gpu-") as output_dir:
        config = run_config(model_dir, Path(output_dir), variant, args)
        train(config)
        rows = read_metrics(config.run_dir / "metrics.jsonl")[args.warmup :]
    wall = time.perf_counter() - started

    def median(key: str) -> float:
        return statistics.median(row.get(key, 0.0) for row in rows)

    update = median("time/update")
    tokens = statistics.median(
        row["throughput/train_tokens_per_s"]
        * sum(row.get(f"time/{p}", 0.0) for p in ("logprobs", "update"))
        for row in rows
    )
    tflops = 6.0 * matmul_params * tokens / update / 1e12
    return {
        "variant": variant,
        "step_s": median("time/step"),
        "rollout_s": median("time/rollout"),
        "logprobs_s": median("time/logprobs"),
        "update_s": update,
        "tokens": tokens,
        "train_tokens_per_s": tokens / update,
        "update_tflops": tflops,
        "mfu": tflops / args.peak_tflops,
        "rollout_tokens_per_s": median("throughput/rollout_tokens_per_s"),
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0,
        "run_wall_s": wall,
        "phases": {k: median(k) for k in rows[-1] if k.startswith("time/")},
    }


def main() -> None:
    """Build the model once, train each variant, print a table and save the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", required=True, help="a folder with a tokenizer")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    parser.add_argument("--variants", default="padded,packed,gc,lora")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--micro-batch-tokens", type=int, default=16384)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--peak-tflops", type=float, default=H100_BF16_TFLOPS)
    parser.add_argument("--device", default="cuda", help="cpu checks the script (tiny shape)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="envhub-model-") as tmp:
        matmul_params = make_model(Path(tmp), args.shape, args.tokenizer)
        for variant in args.variants.split(","):
            results.append(run_variant(Path(tmp), variant, matmul_params, args))
            print("RESULT " + json.dumps(results[-1]), flush=True)
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    print(f"{args.shape} (random weights) on {device}, bf16 autocast")
    columns = ["step_s", "rollout_s", "logprobs_s", "update_s", "train_tokens_per_s",
               "update_tflops", "mfu", "rollout_tokens_per_s", "peak_memory_gib"]  # fmt: skip
    print(f"{'variant':<8}" + "".join(f"{c:>22}" for c in columns))
    for r in results:
        print(f"{r['variant']:<8}" + "".join(f"{r[c]:>22.3f}" for c in columns))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
