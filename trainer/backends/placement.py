"""A micro-batch laid out on the host, then placed on the device: nothing in its forward,
loss or backward waits on the device.

Everything data-dependent about a micro-batch is known on the host, where it was collated:
which places the loss reads, where each sequence sits in a packed row, whether any row is
padded. Asked on the device instead (``logits[loss_mask > 0]``, ``out[keep] = values``,
transformers' checks of a mask or of position ids), each question is an op whose result decides
what runs next, so the host waits for the device to finish and copies the answer back, several
times per micro-batch. Here the host works them out once, as integer indices and shapes, and the
device only gathers, scatters and attends.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from envhub.trainer.backends import packed_attention
from envhub.trainer.backends.compiled_layers import bucket_length
from envhub.trainer.batch import MicroBatch, to_device


@dataclass(frozen=True)
class Targets:
    """The ``N`` trained target places of a ``[n, width - 1]`` micro-batch, as integer indices.

    Position ``t`` of sequence ``i`` scores token ``t + 1`` (``MicroBatch``'s alignment)."""

    shape: tuple[int, int]
    """``(n, width - 1)``: the layout of ``MicroBatch.loss_mask``."""
    rows: torch.Tensor
    """``[N]`` the sequence of each place."""
    columns: torch.Tensor
    """``[N]`` the position of each place in its sequence."""
    tokens: torch.Tensor
    """``[N]`` the token each place scores."""

    @classmethod
    def of(cls, mb: MicroBatch) -> Targets:
        """The places where ``mb.loss_mask`` is 1 (``mb`` on the host: no device work)."""
        rows, columns = (mb.loss_mask > 0).nonzero(as_tuple=True)
        tokens = mb.input_ids[:, 1:][rows, columns]
        return cls(tuple(mb.loss_mask.shape), rows, columns, tokens)

    def __len__(self) -> int:
        return int(self.rows.numel())

    def to(self, device: torch.device | str) -> Targets:
        """A copy with the index tensors on ``device`` (copied without waiting where it can)."""
        return replace(
            self,
            rows=to_device(self.rows, device),
            columns=to_device(self.columns, device),
            tokens=to_device(self.tokens, device),
        )

    def spread(self, values: torch.Tensor) -> torch.Tensor:
        """``[N]`` values placed at their places of a zero ``[n, width - 1]`` tensor
        (differentiable in ``values``)."""
        out = values.new_zeros(self.shape)
        return out.index_put((self.rows, self.columns), values)


@dataclass(frozen=True)
class Placed:
    """A micro-batch's forward inputs on the device, and where its targets are read."""

    inputs: dict[str, Any]
    """Keyword arguments of the model's (or its decoder's) forward."""
    targets: Targets | None
    """The trained places, when the head runs on those only; ``None``: on every place."""
    states: tuple[Any, ...]
    """Indexes the forward's ``[b, T, ...]`` output at each target (with ``targets``: the
    ``N`` trained ones, giving ``[N, ...]``; else all, giving ``[n, width - 1, ...]``)."""
    tokens: torch.Tensor
    """The tokens the places score: ``[N]``, or ``[n, width - 1]``."""


def place(
    mb: MicroBatch,
    device: torch.device,
    *,
    packed: bool,
    head_on_targets: bool,
    sdpa_mask: bool = True,
    bucket: bool = False,
) -> Placed:
    """Lay ``mb`` (on the host) out for the forward and move what it needs to ``device``.

    Args:
        mb: The micro-batch, right-padded, on the host.
        device: The model's device.
        packed: Run it as one packed row (:class:`packed_attention.PackedRow`).
        head_on_targets: Read only the trained places (the head then runs on those alone).
        sdpa_mask: The model attends with SDPA (``sdpa`` or :mod:`packed_attention`'s), so a
            padded batch may get its mask built here, in SDPA's boolean form; other attention
            implementations (eager's additive mask, flash-attention's padding mask) get the
            2-D mask and build theirs as transformers does.
        bucket: Pad the row (packed) or the width (padded) to its
            :func:`compiled_layers.bucket_length`, so compiled layers meet few lengths.
    """
    targets = Targets.of(mb) if head_on_targets else None
    placed = targets.to(device) if targets is not None else None
    if packed:
        layout = packed_attention.PackedRow.of(mb)
        if bucket:
            layout = layout.padded_to(bucket_length(layout.input_ids.shape[1]))
        inputs = layout.to(device).model_inputs() | {"attention_mask": packed_attention.NO_MASK}
        rows = layout.scoring if targets is None else layout.scoring[targets.rows, targets.columns]
        states: tuple[Any, ...] = (to_device(torch.zeros_like(rows), device),
                                   to_device(rows, device))  # fmt: skip
    else:
        width = mb.input_ids.shape[1]
        extra = bucket_length(width) - width if bucket else 0
        ids, mask = (
            torch.nn.functional.pad(t, (0, extra)) for t in (mb.input_ids, mb.attention_mask)
        )
        inputs = {
            "input_ids": to_device(ids, device),
            "attention_mask": _padded_attention_mask(mask, device, sdpa_mask),
        }
        # every place of the batch but the last: position t scores token t + 1
        whole = (slice(None), slice(0, width - 1))
        states = (placed.rows, placed.columns) if placed is not None else whole
    tokens = placed.tokens if placed is not None else to_device(mb.input_ids[:, 1:], device)
    return Placed(inputs, placed, states, tokens)


def _padded_attention_mask(
    mask: torch.Tensor, device: torch.device, sdpa: bool
) -> torch.Tensor | None:
    """The attention mask of a right-padded batch: ``None`` when no row is padded (plain causal
    attention), else, for SDPA, the ``[n, 1, width, width]`` causal-and-not-padding boolean
    mask built on the device by ops whose results decide nothing on the host (transformers,
    given the 2-D mask, would first ask the device whether it is all ones, twice); for other
    attention implementations the 2-D mask."""
    if bool(mask.all()):  # ``mask`` is on the host: no wait
        return None
    if not sdpa:
        return to_device(mask, device)
    width = mask.shape[1]
    keys = mask.to(device, dtype=torch.bool, non_blocking=True)[:, None, None, :]
    causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
    return causal[None, None] & keys
