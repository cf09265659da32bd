"""One critic rank for the Megatron critic tests (run under ``torchrun``).

Builds the critic worker for the tiny model, records its values of the rank tests' batch, the
metrics of two value updates and the values after them, then reloads the checkpoint saved
between the updates and repeats the second one; saves what this rank holds to
``OUT/critic-rank-R.pt``.
Usage: ``torchrun --nproc-per-node N critic_main.py MODEL_DIR OUT TP PP``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rank_main import batch, packed  # noqa: E402  (the policy tests' batch)

from envhub.trainer.batch import Batch  # noqa: E402
from envhub.trainer.critic.targets import ValueTarget, stack_targets, value_places  # noqa: E402
from envhub.trainer.megatron.critic_worker import MegatronCriticWorker  # noqa: E402
from envhub.trainer.megatron.worker import WorkerSpec  # noqa: E402

OPTIMIZER = {"lr": 1e-3, "grad_clip": 0.2, "weight_decay": 0.01, "total_updates": 4}
VALUE_CLIP = 0.01


def critic_batch() -> Batch:
    """The policy tests' five sequences, each learning returns that grow along it, on the places
    the policy sampled; old values 0 (a new head)."""
    samples = []
    for s in batch().samples:
        places = len(s) - 1
        returns = torch.linspace(-1.0, 2.0, places, dtype=torch.float64) * (1 + s.advantage)
        mask = torch.tensor(s.loss_mask[1:], dtype=torch.bool)
        target = ValueTarget(torch.zeros(places, dtype=torch.float64), returns, mask)
        samples.append(replace(s, value_target=target))
    return Batch(samples)


def targets(b: Batch, mbs: list) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Each micro-batch's stacked value targets."""
    return [
        stack_targets([b.samples[i].value_target for i in mb.samples], mb.input_ids.shape[1] - 1)
        for mb in mbs
    ]


def main(model_dir: str, out: str, tp: int, pp: int) -> None:
    spec = WorkerSpec(model_dir, tp, pp, schedule="constant", **OPTIMIZER)
    worker = MegatronCriticWorker(spec, value_clip=VALUE_CLIP)
    b = critic_batch()
    mbs = packed(b)
    goals, places = targets(b, mbs), value_places(b.samples)
    record = {"info": worker.rank_info(), "values": worker.values(mbs)}
    record["metrics"] = [worker.update_values(mbs, goals, places)]
    worker.save_checkpoint(str(Path(out) / "critic-checkpoint"))
    record["metrics"].append(worker.update_values(mbs, goals, places))
    record["values_after"] = worker.values(mbs)
    worker.load_checkpoint(str(Path(out) / "critic-checkpoint"))  # back to after update 1
    record["metrics_resumed"] = worker.update_values(mbs, goals, places)
    record["values_resumed"] = worker.values(mbs)
    torch.save(record, Path(out) / f"critic-rank-{os.environ['RANK']}.pt")
    worker.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
