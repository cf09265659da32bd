"""The trained tokens' logprob/entropy pass alone, eager against fused: milliseconds for the
forward and backward of one micro-batch's logits, kernels launched, peak memory, and how far
the fused results are from the eager ones.

Three ways of the same pass over ``[--tokens, --vocab]`` bf16 logits (a 4,096-token micro-batch
of Qwen2.5's 151,936-token vocabulary by default):

- ``eager``: what the torch backend runs without ``backend.compile.logprobs`` (the logits cast
  to float32 and divided by the temperature, ``selective_log_softmax``, ``token_entropy``);
- ``chunks``: ``fused_logprobs`` with its chunk functions run eagerly;
- ``compiled``: ``fused_logprobs`` compiled (Triton on CUDA), what ``backend.compile.logprobs``
  runs. Its first call compiles; the time is reported apart.

    python bench/logprob_kernel.py                       # a GPU
    .venv/bin/python bench/logprob_kernel.py --tokens 256 --vocab 4096 --repeats 2   # CPU check

The last line, ``SUMMARY ...``, holds the numbers ``bench/gpu_checks.sh`` collects.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from envhub.trainer.algorithms import selective_log_softmax, token_entropy
from envhub.trainer.backends.compiled_layers import compile_seconds
from envhub.trainer.backends.fused_logprobs import fused_logprobs

TEMPERATURE = 0.7


def eager(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch backend's pass without compilation (``TorchBackend._scores``)."""
    scaled = logits.float() / TEMPERATURE
    logprobs = selective_log_softmax(scaled[None], targets[None])[0]
    return logprobs, token_entropy(scaled.detach()[None])[0]


def ways() -> dict[str, Callable[[torch.Tensor, torch.Tensor], tuple]]:
    """The three ways, by name."""
    return {
        "eager": eager,
        "chunks": lambda x, t: fused_logprobs(x, t, TEMPERATURE, compiled=False),
        "compiled": lambda x, t: fused_logprobs(x, t, TEMPERATURE, compiled=True),
    }


def run_once(way: Callable, logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor):
    """One forward and backward; the logprobs, entropy and the logits' gradient."""
    x = logits.detach().requires_grad_()
    logprobs, entropy = way(x, targets)
    (logprobs * weights).sum().backward()
    return logprobs.detach(), entropy.detach(), x.grad


def timed(call: Callable[[], object], gpu: bool) -> float:
    """Seconds of ``call``, the device waited for."""
    if gpu:
        torch.cuda.synchronize()
    start = time.perf_counter()
    call()
    if gpu:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def kernels(call: Callable[[], object], gpu: bool) -> int:
    """Device kernels one ``call`` launches; on the CPU, the top-level ops it runs."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with profile(activities=activities) as prof:
        call()
        if gpu:
            torch.cuda.synchronize()
    if gpu:
        return sum(1 for e in prof.events() if e.device_type == DeviceType.CUDA)
    return sum(1 for e in prof.events() if e.cpu_parent is None)


def measure(args: argparse.Namespace) -> dict:
    """Every way's timings, kernels, memory and distance from ``eager``."""
    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    g = torch.Generator(device=device).manual_seed(0)
    logits = (3 * torch.randn(args.tokens, args.vocab, generator=g, device=device)).bfloat16()
    targets = torch.randint(0, args.vocab, (args.tokens,), generator=g, device=device)
    weights = torch.randn(args.tokens, generator=g, device=device)
    results, reference = {}, None
    for name, way in ways().items():
        once = functools.partial(run_once, way, logits, targets, weights)
        before = compile_seconds()
        first = timed(once, gpu)
        if gpu:
            torch.cuda.reset_peak_memory_stats()
        seconds = [timed(once, gpu) for _ in range(args.repeats)]
        outputs = once()
        reference = reference or outputs
        results[name] = {
            "ms": 1000 * statistics.median(seconds),
            "first_s": first,
            "compile_s": compile_seconds() - before,
            "kernels": kernels(once, gpu),
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if gpu else 0.0,
            "max_diff": [float((a.float() - b.float()).abs().max())
                         for a, b in zip(outputs, reference, strict=True)],
        }  # fmt: skip
    return {"device": torch.cuda.get_device_name() if gpu else "cpu", "ways": results}


def main() -> None:
    """Measure, print a table and the summary line (and ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    report = measure(args)
    print(f"[{args.tokens}, {args.vocab}] bf16 logits on {report['device']}")
    print(f"{'':<10}{'ms':>10}{'first s':>10}{'kernels':>10}{'peak GiB':>10}  max |diff| vs eager")
    for name, r in report["ways"].items():
        diffs = ", ".join(f"{d:.1e}" for d in r["max_diff"])
        print(f"{name:<10}{r['ms']:>10.2f}{r['first_s']:>10.1f}{r['kernels']:>10}"
              f"{r['peak_gib']:>10.2f}  logprobs, entropy, grad: {diffs}")  # fmt: skip
    ways_ = report["ways"]
    print(
        f"SUMMARY logprobs [{args.tokens}x{args.vocab}] eager_ms={ways_['eager']['ms']:.2f} "
        f"compiled_ms={ways_['compiled']['ms']:.2f} "
        f"speedup={ways_['eager']['ms'] / ways_['compiled']['ms']:.2f}x "
        f"kernels={ways_['eager']['kernels']}->{ways_['compiled']['kernels']} "
        f"compile_s={ways_['compiled']['compile_s']:.1f} "
        f"max_diff={max(ways_['compiled']['max_diff']):.1e}"
    )
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
