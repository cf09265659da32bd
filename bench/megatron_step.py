"""Megatron vs torch backend: time of one training step on the same model and batch (CPU).

The model is a random-initialised Llama of a small shape (``--hidden``, ``--layers``, SmolLM2's
49k vocabulary and tokenizer); the batch is ``--sequences`` sequences of 64-160 tokens binned
into micro-batches of ``--micro-batch-tokens``, as the loop bins them: right-padded for the torch
backend, packed into one row each (no padding) for Megatron. A step is what the loop runs when
``updates_per_step`` > 1: the old-policy logprobs, then one optimizer update. The torch backend
runs in this process; each Megatron layout runs as two (or one) gloo ranks under torchrun with
the tests' CPU compatibility module. Torch threads: one per rank (two ranks share the two
cores of a CI machine; the torch backend gets both).

    .venv/bin/python bench/megatron_step.py [--hidden 256] [--layers 4] [--sequences 16] \
        [--steps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torchrun_ranks import run_ranks

from envhub.trainer.algorithms import ObjectiveSpec
from envhub.trainer.batch import Batch, Sample, micro_batches

ROOT = Path(__file__).resolve().parents[1]
COMPAT = ROOT / "tests" / "trainer" / "megatron" / "cpu_compat.py"
LAYOUTS = [
    ("megatron 1 rank", 1, 1, 1),
    ("megatron tp=2", 2, 2, 1),
    ("megatron pp=2", 2, 1, 2),
    ("megatron dp=2", 2, 1, 1),
]


def make_model(folder: Path, hidden: int, layers: int) -> None:
    """Save a randomly initialised small Llama and SmolLM2's tokenizer to ``folder``.

    The weights are seeded, so every backend and layout starts from the same model.
    """
    import transformers

    from envhub.trainer.models import resolve_model

    tokenizer = transformers.AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 4,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=1024, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def make_batch(sequences: int, budget: int, packed: bool) -> tuple[Batch, list]:
    """Build a seeded batch of random sequences and bin it into micro-batches.

    Each sequence has 64-160 random token ids, a 16-token prompt left out of the loss, dummy
    sampler logprobs and a random advantage. The same seed gives the same batch on every rank
    and for both backends.

    Args:
        sequences: How many sequences the batch holds.
        budget: The token budget of one micro-batch.
        packed: Bin for packing (Megatron) rather than for right-padding (torch backend).

    Returns:
        The batch and its micro-batches.
    """
    generator = torch.Generator().manual_seed(0)
    samples = []
    for i in range(sequences):
        n = int(torch.randint(64, 161, (1,), generator=generator))
        ids = torch.randint(0, 49152, (n,), generator=generator).tolist()
        samples.append(
            Sample(
                ids,
                [0] * 16 + [1] * (n - 16),
                [-1.0] * n,
                float(torch.randn(1, generator=generator)),
                i,
            )
        )
    batch = Batch(samples)
    return batch, micro_batches(batch, budget, pad_id=0, packed=packed)


def step(backend: object, batch: Batch, mbs: list) -> float:
    """Run one training step (old-policy logprobs, then one update) and return its seconds."""
    start = time.perf_counter()
    backend.logprobs(mbs)
    backend.update(
        mbs,
        ObjectiveSpec(),
        old_logprobs=None,
        ref_logprobs=None,
        num_tokens=batch.num_tokens,
        num_sequences=batch.num_sequences,
    )
    return time.perf_counter() - start


def time_torch(model: Path, args: argparse.Namespace) -> list[float]:
    """Time ``args.steps`` steps of the torch backend on the CPU, in this process.

    One extra step runs first as a warm-up and is not counted.

    Returns:
        The seconds of each timed step.
    """
    from envhub.trainer.backends.torch_backend import TorchBackend
    from envhub.trainer.config import validate_config

    backend = TorchBackend(
        validate_config(
            {
                "model": {"name": str(model)},
                "envs": [{"name": "arithmetic"}],
                "backend": {"device": "cpu"},
            }
        )
    )
    batch, mbs = make_batch(args.sequences, args.micro_batch_tokens, packed=False)
    return [step(backend, batch, mbs) for _ in range(args.steps + 1)][1:]


def rank_main(model: str, tp: int, pp: int, args: argparse.Namespace) -> None:
    """One rank (under torchrun): rank 0 prints its step times as JSON."""
    from envhub.trainer.megatron.worker import MegatronWorker, WorkerSpec

    worker = MegatronWorker(WorkerSpec(model, tp, pp, lr=1e-5))
    batch, mbs = make_batch(args.sequences, args.micro_batch_tokens, packed=True)

    def one() -> float:
        torch.distributed.barrier()
        start = time.perf_counter()
        worker.logprobs(mbs)
        worker.update(
            mbs,
            ObjectiveSpec(),
            old_logprobs=None,
            ref_logprobs=None,
            num_tokens=batch.num_tokens,
            num_sequences=batch.num_sequences,
        )
        torch.distributed.barrier()
        return time.perf_counter() - start

    times = [one() for _ in range(args.steps + 1)][1:]
    if torch.distributed.get_rank() == 0:
        print("TIMES " + json.dumps(times), flush=True)


def time_megatron(
    model: Path, world: int, tp: int, pp: int, args: argparse.Namespace
) -> list[float]:
    """Time ``args.steps`` Megatron steps in one layout, run by ``world`` ranks under torchrun.

    Each rank re-runs this script with ``--rank``; the tests' CPU compatibility module is set as
    the worker setup and the two CPU cores are split between the ranks.

    Returns:
        The seconds of each timed step, as rank 0 reported them.
    """
    env = {
        **os.environ,
        "ENVHUB_MEGATRON_WORKER_SETUP": str(COMPAT),
        "OMP_NUM_THREADS": str(max(1, 2 // world)),
    }
    return run_ranks(
        __file__,
        world,
        ["--rank", str(model), str(tp), str(pp), *_common(args)],
        env=env,
        marker="TIMES",
        timeout=1800,
    )


def _common(args: argparse.Namespace) -> list[str]:
    return [
        "--sequences",
        str(args.sequences),
        "--steps",
        str(args.steps),
        "--micro-batch-tokens",
        str(args.micro_batch_tokens),
    ]


def main() -> None:
    """Parse the arguments; run one rank when ``--rank`` is given, else the whole comparison.

    The comparison builds the model in a temporary directory, times the torch backend and every
    Megatron layout in :data:`LAYOUTS`, and prints the median and fastest seconds per step and
    the tokens per second of each.
    """
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--micro-batch-tokens", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rank", nargs=3, metavar=("MODEL", "TP", "PP"))
    args = parser.parse_args()
    if args.rank:
        return rank_main(args.rank[0], int(args.rank[1]), int(args.rank[2]), args)
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        make_model(model, args.hidden, args.layers)
        torch.set_num_threads(2)
        rows = [("torch backend", time_torch(model, args))]
        rows += [
            (name, time_megatron(model, world, tp, pp, args)) for name, world, tp, pp in LAYOUTS
        ]
    batch, padded = make_batch(args.sequences, args.micro_batch_tokens, packed=False)
    _, packed = make_batch(args.sequences, args.micro_batch_tokens, packed=True)
    tokens = sum(len(s) for s in batch.samples)
    print(
        f"model: Llama hidden={args.hidden} layers={args.layers} vocab=49152; "
        f"batch: {args.sequences} sequences, {tokens} tokens"
    )
    positions = sum(mb.input_ids.numel() for mb in padded)
    print(
        f"torch: {len(padded)} padded micro-batches, {positions} positions; "
        f"megatron: {len(packed)} packed rows, {tokens} positions"
    )
    print(f"{'backend':<18}{'median s/step':>14}{'min':>8}{'tokens/s':>10}")
    for name, times in rows:
        median = statistics.median(times)
        print(f"{name:<18}{median:>14.2f}{min(times):>8.2f}{tokens / median:>10.0f}")


if __name__ == "__main__":
    main()
