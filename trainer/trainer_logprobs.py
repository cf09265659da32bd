"""The trainer's logprob of every trained token, saved beside the step's trajectories.

The sampler's logprobs are on each trajectory; the trainer's (what the loss saw for the same
tokens) are written to ``trajectories/trainer/step-N.jsonl``, one line per trained trajectory:
``{"trajectory": i, "logprobs": [...]}`` with ``i`` the trajectory's line in ``step-N.jsonl`` and
one entry per token id (``null`` where the loss mask is 0). ``envhub report`` colours tokens by
the gap between the two.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch

from envhub.trainer.batch import Batch, MicroBatch

TrainerLogprobs = dict[int, list[float | None]]
"""Trajectory index (its line in the step's file) -> a logprob per token id, ``None`` where the
loss mask is 0."""


def trainer_logprobs_path(run_dir: Path, step: int) -> Path:
    """Where step ``step``'s trainer logprobs go (beside ``trajectories/step-N.jsonl``)."""
    return run_dir / "trajectories" / "trainer" / f"step-{step:06d}.jsonl"


def collect(
    chunk: Batch, micro_batches: Sequence[MicroBatch], logprobs: Sequence[torch.Tensor]
) -> TrainerLogprobs:
    """Each of ``chunk``'s samples' per-target logprobs (``logprobs[k]`` is micro-batch ``k``'s,
    laid out like its ``loss_mask``) as a per-token list keyed by the sample's trajectory.

    Target ``t`` scores token ``t + 1``, so token 0 (never trained) gets ``None``.
    """
    found: TrainerLogprobs = {}
    for mb, values in zip(micro_batches, logprobs, strict=True):
        rows = values.detach().float().cpu().tolist()
        for row, index in enumerate(mb.samples):
            sample = chunk.samples[index]
            if sample.supervised:  # a demonstration: no line of the step's file
                continue
            found[sample.trajectory] = [None] + [
                round(lp, 4) if trained else None
                for lp, trained in zip(rows[row], sample.loss_mask[1:], strict=False)
            ]
    return found


def save(path: Path, logprobs: TrainerLogprobs) -> None:
    """Write ``logprobs`` to ``path`` as JSON lines in trajectory order, replacing any earlier
    file (a resumed run repeats steps)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = (
        json.dumps({"trajectory": index, "logprobs": logprobs[index]}) for index in sorted(logprobs)
    )
    path.write_text("".join(line + "\n" for line in lines))
