"""Megatron backend throughput on a real architecture's shape: training tokens/s, TFLOP/s and MFU
per GPU, and what a weight sync costs the trainer (gathering every HF tensor from the shards).

The model is randomly initialised from the shape of a real one (``--shape``: Qwen2.5-0.5B or
-1.5B; ``tiny`` is a 2-layer Qwen2 for checking the script on a CPU). The batch is random token
ids in sequences of ``--seq``/2 to ``--seq`` tokens, ``--tokens`` in all, packed into micro-batches
of ``--micro-batch-tokens`` as the training loop packs them. One update = forward, backward and
the optimizer step over every micro-batch (what ``envhub train`` runs per update); the logprobs
pass (forward only) is timed on its own.

Model FLOPs per update: 6 x (matmul parameters, LM head included) per token, plus causal
attention 3 x 4 x layers x q_dim x L(L+1)/2 per sequence of L tokens (fwd + 2 x bwd; no
recomputation counted). MFU = achieved model FLOP/s per GPU / ``--peak-tflops`` (default: dense
bf16 of an H100/H200 SXM, 989 TFLOP/s; pass your card's figure).

    .venv/bin/python bench/megatron_throughput.py --shape qwen2.5-0.5b          # one GPU
    .venv/bin/python bench/megatron_throughput.py --shape qwen2.5-1.5b --tp 2   # two GPUs
    .venv/bin/python bench/megatron_throughput.py --shape tiny --tokens 4096    # CPU check (gloo)

``--compile logprobs|layers|both`` turns on ``backend.compile`` (fused logprobs, compiled
layers); the first update, which compiles, is reported apart with the compile seconds.
``--micro-batch-tokens auto`` takes what ``backend.micro_batch_tokens: auto`` would pick for
this GPU. The last line, ``SUMMARY ...``, holds the numbers ``bench/gpu_checks.sh`` collects.

``--profile`` runs one more update under ``torch.profiler`` and prints, from rank 0, where its
time went: the device's busy time against the wall time (a device idle for most of the update
waits on the host, Python launching kernels), the host-device syncs, and the top ops by host
and by device time. ``--trace-syncs`` runs one more update with torch's sync debug mode on and
prints the Python call sites of the operations that made the host wait for the device, counted
(the profiler counts syncs; this says who asked for them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch
from torchrun_ranks import run_ranks

ROOT = Path(__file__).resolve().parents[1]
COMPAT = ROOT / "tests" / "trainer" / "megatron" / "cpu_compat.py"
SHAPES = {
    "qwen2.5-0.5b": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                     "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936},
    "qwen2.5-1.5b": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                     "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936},
    "tiny": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
             "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 4096},
}  # fmt: skip
H100_BF16_TFLOPS = 989.0


def make_model(folder: Path, shape: str) -> None:
    """A randomly initialised Qwen2 of ``shape`` (tied embeddings, as the small Qwen2.5s), saved
    in bf16."""
    import transformers

    config = transformers.Qwen2Config(
        **SHAPES[shape],
        tie_word_embeddings=True,
        max_position_embeddings=32768,
        rope_theta=1e6,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    transformers.Qwen2ForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)


def make_batch(shape: str, tokens: int, seq: int, budget: int) -> tuple[object, list]:
    """Build a seeded batch of random sequences and pack it into micro-batches.

    Sequences of ``seq // 2`` to ``seq`` random token ids (from the shape's vocabulary) are
    added until they hold ``tokens`` tokens in all; the last one is cut to fit. The first eighth
    of each sequence stands for the prompt and is left out of the loss. The seed makes every
    rank build the same batch.

    Args:
        shape: A key of :data:`SHAPES`, for the vocabulary size.
        tokens: The total number of tokens in the batch.
        seq: The longest sequence.
        budget: The token budget of one packed micro-batch.

    Returns:
        The batch and its packed micro-batches.
    """
    from envhub.trainer.batch import Batch, Sample, micro_batches

    generator = torch.Generator().manual_seed(0)
    vocab, samples, total = SHAPES[shape]["vocab_size"], [], 0
    while total < tokens:
        n = min(int(torch.randint(seq // 2, seq + 1, (1,), generator=generator)), tokens - total)
        if n < 2:
            break
        ids = torch.randint(0, vocab, (n,), generator=generator).tolist()
        samples.append(
            Sample(
                ids,
                [0] * (n // 8) + [1] * (n - n // 8),
                [-1.0] * n,
                float(torch.randn(1, generator=generator)),
                len(samples),
            )
        )
        total += n
    batch = Batch(samples)
    return batch, micro_batches(batch, budget, pad_id=0, packed=True)


def model_flops(shape: str, lengths: list[int]) -> float:
    """Model FLOPs of one update (forward + backward) over sequences of ``lengths`` (see the
    module docstring)."""
    s = SHAPES[shape]
    h, layers, heads, kv = (
        s["hidden_size"],
        s["num_hidden_layers"],
        s["num_attention_heads"],
        s["num_key_value_heads"],
    )
    head_dim = h // heads
    per_layer = (
        h * heads * head_dim * 2 + h * kv * head_dim * 2 + 3 * h * s["intermediate_size"]
    )  # q, o, k, v; gate, up, down
    matmul_params = layers * per_layer + s["vocab_size"] * h
    attention = sum(3 * 4 * layers * heads * head_dim * n * (n + 1) / 2 for n in lengths)
    return 6.0 * matmul_params * sum(lengths) + attention


COMPILE_CHOICES = ("off", "logprobs", "layers", "both")
"""``--compile``: which of ``backend.compile``'s switches are on."""


def budget_arg(text: str) -> int | str:
    """``--micro-batch-tokens``: a number or ``auto``."""
    return text if text == "auto" else int(text)


def resolve_budget(model: str | Path, args: argparse.Namespace, kind: str) -> int:
    """``args.micro_batch_tokens``, with ``auto`` resolved as a run of backend ``kind`` on
    this machine's first GPU would resolve it (4096 without one)."""
    from envhub.trainer.config import validate_config
    from envhub.trainer.estimate import device_memory, micro_batch_tokens

    config = validate_config({
        "model": {"name": str(model), "gradient_checkpointing": args.recompute},
        "envs": [{"name": "arithmetic"}], "rollout": {"engine": "vllm"},
        "backend": {"kind": kind, "micro_batch_tokens": args.micro_batch_tokens},
    })  # fmt: skip
    gpu = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    return micro_batch_tokens(config, device_memory(gpu))


def rank_main(model: str, shape: str, args: argparse.Namespace) -> None:
    """One rank (under torchrun): rank 0 prints its timings as JSON."""
    from envhub.trainer.algorithms import ObjectiveSpec
    from envhub.trainer.backends.compiled_layers import compile_seconds
    from envhub.trainer.megatron.bridge import hf_weights
    from envhub.trainer.megatron.worker import MegatronWorker, WorkerSpec

    gpu = torch.cuda.is_available()
    worker = MegatronWorker(
        WorkerSpec(
            model,
            args.tp,
            args.pp,
            dtype="bfloat16" if gpu else "float32",
            lr=1e-6,
            recompute=args.recompute,
            compile_logprobs=args.compile in ("logprobs", "both"),
            compile_layers=args.compile in ("layers", "both"),
        )
    )
    budget = resolve_budget(model, args, "megatron")
    batch, mbs = make_batch(shape, args.tokens, args.seq, budget)

    def timed(call: object) -> float:
        torch.distributed.barrier()
        if gpu:
            torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        if gpu:
            torch.cuda.synchronize()
        torch.distributed.barrier()
        return time.perf_counter() - start

    def update() -> None:
        worker.update(
            mbs,
            ObjectiveSpec(),
            old_logprobs=None,
            ref_logprobs=None,
            num_tokens=batch.num_tokens,
            num_sequences=batch.num_sequences,
        )

    def gather() -> None:
        for _ in hf_weights(worker.bridge, [worker.model.module]):
            pass

    first, *updates = [timed(update) for _ in range(args.steps + 1)]  # the first warms up
    logprobs = [timed(lambda: worker.logprobs(mbs)) for _ in range(2)][1:]
    gathers = [timed(gather) for _ in range(3)][1:]
    weight_bytes = sum(
        t.numel() * t.element_size() for _, t in hf_weights(worker.bridge, [worker.model.module])
    )
    parameters = worker.num_parameters()  # a collective: every rank
    profiled = diagnose(update, gpu, args)
    if torch.distributed.get_rank() == 0:
        memory = torch.cuda.max_memory_allocated() / 2**30 if gpu else 0.0
        report = {
            "updates": updates, "logprobs": logprobs, "gathers": gathers,
            "weight_bytes": weight_bytes, "lengths": [len(s) for s in batch.samples],
            "micro_batches": len(mbs), "parameters": parameters,
            "device": torch.cuda.get_device_name() if gpu else "cpu", "max_memory_gib": memory,
            "profile": profiled, "first_update_s": first, "compile_s": compile_seconds(),
            "micro_batch_tokens": budget,
        }  # fmt: skip
        print("REPORT " + json.dumps(report), flush=True)
    worker.shutdown()


SYNC_OPS = ("aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaDeviceSynchronize")
"""Ops that make the host wait for the device (``.item()``, ``.tolist()``, explicit syncs)."""


def profile_update(update: Callable[[], None], gpu: bool, rows: int = 25) -> str:
    """One ``update()`` under ``torch.profiler``: the device's busy time against the wall time,
    the host-device syncs, and the top ``rows`` ops by host time (and by device time on a
    GPU), as text. Under torch.distributed every rank runs it (the update's collectives need
    them all)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        update()
        if gpu:
            torch.cuda.synchronize()
    wall = time.perf_counter() - start
    events = prof.key_averages()
    syncs = {e.key: e.count for e in events if e.key in SYNC_OPS}
    lines = [f"profiled update: {wall:.3f} s wall (profiler on); host-device syncs: {syncs}"]
    if gpu:
        kernels = [e for e in events if str(getattr(e, "device_type", "")).endswith("CUDA")]
        busy = sum(getattr(e, "self_device_time_total", 0.0) for e in kernels) / 1e6
        lines.append(f"device busy {busy:.3f} s = {busy / wall:.0%} of the wall time")
        lines.append(events.table(sort_by="self_device_time_total", row_limit=rows))
    lines.append(events.table(sort_by="self_cpu_time_total", row_limit=rows))
    return "\n".join(lines)


def trace_syncs(update: Callable[[], None], rows: int = 15, depth: int = 3) -> str:
    """One ``update()`` with ``torch.cuda.set_sync_debug_mode("warn")``: each operation that
    makes the host wait for the device warns, and the Python stack at that moment (the
    innermost ``depth`` frames outside torch's own files) is counted. Returns the ``rows``
    commonest call sites as text. Syncs inside the autograd engine's threads have no Python
    frame of their own and are counted as ``(backward)``."""
    sites: Counter[str] = Counter()

    def record(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
        if "synchronizing" not in str(message):
            return
        frames = [
            f"{Path(f.filename).name}:{f.lineno} {f.name}"
            for f in traceback.extract_stack()[:-1]
            if "/torch/" not in f.filename and "warnings" not in Path(f.filename).name
        ]
        sites[" <- ".join(reversed(frames[-depth:])) or "(backward)"] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            update()
            torch.cuda.synchronize()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    lines = [f"sync trace: {sum(sites.values())} synchronizing operations in one update"]
    lines += [f"{count:6d}  {site}" for site, count in sites.most_common(rows)]
    return "\n".join(lines)


def diagnose(update: Callable[[], None], gpu: bool, args: argparse.Namespace) -> str | None:
    """What ``--profile`` and ``--trace-syncs`` (on a GPU) ask for, each from one more
    ``update()``, as text (``None``: neither). A profiler that fails is reported, not raised:
    it must not cost the timings taken before it."""
    try:
        profiled = profile_update(update, gpu) if args.profile else None
    except Exception as e:
        profiled = f"profiling failed: {type(e).__name__}: {e}"
    if args.trace_syncs and gpu:
        profiled = "\n".join(filter(None, [profiled, trace_syncs(update)]))
    return profiled


def measure(model: Path, args: argparse.Namespace) -> dict:
    """Run the ``tp x pp`` ranks under torchrun on the saved ``model`` and return rank 0's report.

    Without a GPU the ranks use gloo through the tests' CPU compatibility module and share the
    CPU cores between them.

    Returns:
        The report dict that :func:`rank_main` prints on rank 0 (timings, sizes, device).
    """
    world = args.tp * args.pp
    env = dict(os.environ)
    if not torch.cuda.is_available():
        env |= {
            "ENVHUB_MEGATRON_WORKER_SETUP": str(COMPAT),
            "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // world)),
        }
    return run_ranks(
        __file__,
        world,
        ["--rank", str(model), *_forwarded(args)],
        env=env,
        marker="REPORT",
        timeout=3600,
    )


def _forwarded(args: argparse.Namespace) -> list[str]:
    flags = ["--shape", args.shape, "--tp", str(args.tp), "--pp", str(args.pp),
             "--tokens", str(args.tokens), "--seq", str(args.seq),
             "--micro-batch-tokens", str(args.micro_batch_tokens),
             "--steps", str(args.steps), "--compile", args.compile]  # fmt: skip
    switches = [("--recompute", args.recompute), ("--profile", args.profile),
                ("--trace-syncs", args.trace_syncs)]  # fmt: skip
    return flags + [flag for flag, on in switches if on]


def print_report(report: dict, args: argparse.Namespace) -> None:
    """Print the model, the batch, and a table of throughput, MFU, weight-gather time and memory.

    Args:
        report: Rank 0's report, as :func:`measure` returns it.
        args: The parsed arguments (shape, layout and ``--peak-tflops`` for the MFU).
    """
    world = args.tp * args.pp
    tokens = sum(report["lengths"])
    update = statistics.median(report["updates"])
    flops = model_flops(args.shape, report["lengths"])
    per_gpu = flops / update / world / 1e12
    gather = statistics.median(report["gathers"])
    print(
        f"{args.shape}: {report['parameters'] / 1e6:.1f}M parameters on {world} x "
        f"{report['device']} (tp={args.tp} pp={args.pp}, recompute={args.recompute}, "
        f"compile={args.compile})"
    )
    print(
        f"batch: {len(report['lengths'])} sequences, {tokens} tokens, "
        f"{report['micro_batches']} packed micro-batches of <= {report['micro_batch_tokens']} "
        f"tokens"
    )
    mfu = per_gpu / args.peak_tflops if report["device"] != "cpu" else None
    rows = [
        ("update s (median)", f"{update:.3f}"),
        ("training tokens/s", f"{tokens / update:,.0f}"),
        ("training tokens/s per device", f"{tokens / update / world:,.0f}"),
        ("model TFLOP/s per device", f"{per_gpu:.3g}"),
        (
            "MFU",
            f"{per_gpu / args.peak_tflops:.1%}" if report["device"] != "cpu" else "n/a on the CPU",
        ),
        ("logprobs pass s", f"{statistics.median(report['logprobs']):.3f}"),
        (
            "weight gather s (per sync)",
            f"{gather:.3f}  ({report['weight_bytes'] / 2**30:.2f} GiB, "
            f"{report['weight_bytes'] / gather / 2**30:.1f} GiB/s)",
        ),
        ("peak memory GiB (rank 0)", f"{report['max_memory_gib']:.1f}"),
        ("first update s (compiles)", f"{report['first_update_s']:.3f}"),
        ("torch.compile s (rank 0)", f"{report['compile_s']:.1f}"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    if report.get("profile"):
        print(report["profile"])
    print(
        f"SUMMARY {args.shape} mb={report['micro_batch_tokens']} compile={args.compile} "
        f"recompute={args.recompute} tokens/s={tokens / update:,.0f} "
        f"mfu={f'{mfu:.1%}' if mfu is not None else 'n/a'} update_s={update:.3f} "
        f"first_s={report['first_update_s']:.1f} compile_s={report['compile_s']:.1f} "
        f"mem_gib={report['max_memory_gib']:.1f}"
    )


def main() -> None:
    """Parse the arguments; run one rank when ``--rank`` is given, else the whole benchmark.

    The benchmark saves the model in a temporary directory, runs the ranks on it and prints
    rank 0's report.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=65536, help="tokens per update")
    parser.add_argument("--seq", type=int, default=2048, help="longest sequence")
    parser.add_argument("--micro-batch-tokens", type=budget_arg, default=16384, help="or auto")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--compile", choices=COMPILE_CHOICES, default="off")
    parser.add_argument(
        "--recompute",
        action="store_true",
        help="activation recomputation (model.gradient_checkpointing)",
    )
    parser.add_argument(
        "--peak-tflops", type=float, default=H100_BF16_TFLOPS, help="the card's dense bf16 peak"
    )
    parser.add_argument(
        "--profile", action="store_true", help="profile one more update (see the docstring)"
    )
    parser.add_argument(
        "--trace-syncs",
        action="store_true",
        help="on a GPU, count the call sites of one more update's host-device syncs",
    )
    parser.add_argument("--rank", metavar="MODEL")
    args = parser.parse_args()
    if args.rank:
        return rank_main(args.rank, args.shape, args)
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / args.shape
        make_model(model, args.shape)
        report = measure(model, args)
    print_report(report, args)


if __name__ == "__main__":
    main()
