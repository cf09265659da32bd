"""The Megatron ranks' bookkeeping of micro-batches: fillers and uniform metrics across data
ranks, each micro-batch's report left on the device, and an update's metrics from the
all-reduced sums."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from envhub.trainer.batch import MicroBatch


def uniform_supervision(batches: list[MicroBatch]) -> list[MicroBatch]:
    """``batches``, each with a ``supervised`` tensor (zeros where it had none) when any has
    one: every micro-batch on every data rank then reports the same metrics, which the
    all-reduce of their sums needs (an all-zero weight changes no loss)."""
    if all(mb.supervised is None for mb in batches):
        return batches
    return [
        mb
        if mb.supervised is not None
        else replace(mb, supervised=torch.zeros_like(mb.loss_mask, dtype=torch.float32))
        for mb in batches
    ]


def empty_like(mb: MicroBatch) -> MicroBatch:
    """``mb`` with nothing to train on (no loss token, no sequence): a data rank's filler."""
    zeros = torch.zeros_like(mb.loss_mask)
    return MicroBatch(
        mb.input_ids,
        mb.attention_mask,
        zeros,
        torch.zeros_like(mb.sampler_logprobs),
        mb.advantages,
        [],
        supervised=None if mb.supervised is None else torch.zeros_like(mb.supervised),
    )


def micro_batch_report(
    loss: torch.Tensor, weight: float, metrics: dict[str, Any]
) -> dict[str, torch.Tensor | float]:
    """A micro-batch's loss and its metrics times ``weight``, left on the device: reading them
    here would make the host wait for the GPU after every forward pass instead of queueing the
    backward pass."""
    return {
        "loss": loss.detach().double(),
        "weight": weight,
        **{name: torch.as_tensor(v).detach().double() * weight for name, v in metrics.items()},
    }


def sum_reports(reports: list[dict[str, Any]], device: torch.device) -> torch.Tensor:
    """This rank's reports summed, as one float64 tensor on ``device`` (keys in sorted order),
    for one all-reduce."""
    keys = sorted(reports[0]) if reports else []
    sums = [sum(r[key] for r in reports) for key in keys]
    if not sums:
        return torch.zeros(0, dtype=torch.float64, device=device)
    return torch.stack([torch.as_tensor(v, dtype=torch.float64, device=device) for v in sums])


def update_metrics(
    totals: torch.Tensor, reports: list[dict[str, Any]], grad_norm: float | None, lr: float
) -> dict[str, float]:
    """An update's metrics from every rank's summed reports (``totals``, in the sorted order of
    ``reports[0]``'s keys): the loss summed, the rest weighted means; grad norm and lr."""
    summed = dict(zip(sorted(reports[0]), totals.tolist(), strict=True))
    weight = max(summed.pop("weight"), 1.0)
    metrics = {
        name: (value if name == "loss" else value / weight) for name, value in summed.items()
    }
    metrics["grad_norm"] = float(grad_norm or 0.0)
    metrics["lr"] = lr
    return metrics
