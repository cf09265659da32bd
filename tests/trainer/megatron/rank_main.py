"""One trainer rank for the Megatron worker tests (run under ``torchrun``).

Builds the worker for the tiny model, records the HF weights it exports before training (the
conversion round trip), the token logprobs, and the metrics and weights after two updates on
the batch that ``batch()`` makes, syncs those weights to the engines named in
``ENVHUB_TEST_ENGINE_URLS`` (when set), then reloads the checkpoint saved between the updates
and repeats the second one; saves what this rank holds to ``OUT/rank-R.pt``.
Usage: ``torchrun --nproc-per-node N rank_main.py MODEL_DIR OUT TP PP [recompute]
[distributed-optimizer] [bfloat16]``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from envhub.trainer.algorithms import ObjectiveSpec
from envhub.trainer.batch import Batch, Sample, micro_batches
from envhub.trainer.megatron.worker import MegatronWorker, WorkerSpec

VOCAB = 49152
LENGTHS = (9, 14, 6, 11, 7)
ADVANTAGES = (1.0, -0.5, 0.7, -1.2, 0.3)
OPTIMIZER = {
    "lr": 1e-3,
    "grad_clip": 0.2,
    "weight_decay": 0.01,
    "schedule": "linear",
    "warmup_steps": 0,
    "total_updates": 4,
}
TEMPERATURE = 0.7
ENGINES_ENV = "ENVHUB_TEST_ENGINE_URLS"
"""Comma-separated URLs of weight-transfer engines the ranks sync to after training."""


DEMONSTRATION = 2
"""The sample that is a demonstration (its tokens learn by cross-entropy, weight 0.5)."""


def batch() -> Batch:
    """Five sequences of different lengths, prompts unmasked, random sampler logprobs; one of
    them a demonstration (the supervised term, in a micro-batch with a sampled sequence)."""
    generator = torch.Generator().manual_seed(0)
    samples = []
    for i, (n, advantage) in enumerate(zip(LENGTHS, ADVANTAGES, strict=True)):
        ids = torch.randint(0, VOCAB, (n,), generator=generator).tolist()
        sampler = (-torch.rand(n, generator=generator) * 10).tolist()
        supervised = 0.5 if i == DEMONSTRATION else 0.0
        samples.append(
            Sample(ids, [0] * 3 + [1] * (n - 3), sampler, advantage, i, supervised=supervised)
        )
    return Batch(samples)


def packed(b: Batch) -> list:
    """Three packed micro-batches (14+6, 11+9, 7 tokens): under DP=2 one replica runs two, the
    other one and a filler."""
    mbs = micro_batches(b, 20, pad_id=0, packed=True)
    assert len(mbs) == 3
    return mbs


def sync_to_engines(worker: MegatronWorker, urls: list[str]) -> dict:
    """Two weight syncs straight from the ranks to the engines at ``urls`` (``envhub_shm``,
    buckets of about 1 MB), over one connection; what each rank reports, and whether rank 0's
    shared file is gone after closing."""
    from envhub.trainer.weight_sync import TransferPlan

    plan = TransferPlan("envhub_shm", bucket_bytes=1 << 20, dtype="float32", urls=tuple(urls))
    sender = worker.connect_weight_transfer(plan)
    sent = [worker.send_weights(), worker.send_weights()]
    shared_file = worker._transfer.transfer.path  # the envhub_shm trainer engine's file
    worker.close_weight_transfer()
    return {
        "sender": sender,
        "sent": sent,
        "shared_file_left": shared_file is not None and shared_file.exists(),
    }


def main(
    model_dir: str,
    out: str,
    tp: int,
    pp: int,
    recompute: bool = False,
    distributed_optimizer: bool = False,
    dtype: str = "float32",
    compiled: bool = False,
) -> None:
    worker = MegatronWorker(
        WorkerSpec(
            model_dir,
            tp,
            pp,
            temperature=TEMPERATURE,
            reference=True,
            recompute=recompute,
            distributed_optimizer=distributed_optimizer,
            dtype=dtype,
            compile_logprobs=compiled,
            compile_layers=compiled,
            **OPTIMIZER,
        )
    )
    b = batch()
    mbs = packed(b)
    record = {
        "info": worker.rank_info(),
        "weights_before": worker.hf_state_dict(),
        "logprobs": worker.logprobs(mbs),
    }
    record["recompute"] = worker.bridge.config.recompute_granularity
    inner = getattr(worker.optimizer, "chained_optimizers", [worker.optimizer])[0]
    record["optimizer"] = type(inner).__name__
    record["parameter_dtypes"] = sorted({str(p.dtype) for p in worker.model.parameters()})
    spec = ObjectiveSpec()

    def update() -> dict | None:
        return worker.update(
            mbs,
            spec,
            old_logprobs=None,
            ref_logprobs=None,
            num_tokens=b.num_tokens,
            num_sequences=b.num_sequences,
        )

    record["metrics"] = [update()]
    worker.save_checkpoint(str(Path(out) / "checkpoint"))
    record["metrics"].append(update())
    record["weights_after"] = worker.hf_state_dict()
    record["reference_logprobs"] = worker.logprobs(mbs, reference=True)
    worker.begin_weights()
    record["weight_buckets"] = []
    while (bucket := worker.next_weights(max_bytes=1 << 20)) != []:
        record["weight_buckets"].append(bucket)
    if urls := os.environ.get(ENGINES_ENV):
        record |= sync_to_engines(worker, urls.split(","))
    worker.load_checkpoint(str(Path(out) / "checkpoint"))  # back to after the first update
    record["metrics_resumed"] = update()
    record["weights_resumed"] = worker.hf_state_dict()
    record["num_parameters"] = worker.num_parameters()
    torch.save(record, Path(out) / f"rank-{os.environ['RANK']}.pt")
    worker.shutdown()


if __name__ == "__main__":
    main(
        sys.argv[1],
        sys.argv[2],
        int(sys.argv[3]),
        int(sys.argv[4]),
        recompute="recompute" in sys.argv[5:],
        distributed_optimizer="distributed-optimizer" in sys.argv[5:],
        dtype="bfloat16" if "bfloat16" in sys.argv[5:] else "float32",
        compiled="compiled" in sys.argv[5:],
    )
