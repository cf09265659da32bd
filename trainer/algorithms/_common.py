"""Helpers shared by the algorithm modules: masked reductions and the log-ratio bound."""

from __future__ import annotations

import torch
from torch import Tensor

# Log-ratios are clamped before exp: e^20 ~ 5e8 is far past any clip range, and an overflow to
# inf would turn the zero gradient of a clipped branch into 0 * inf = NaN.
MAX_LOG_RATIO = 20.0


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``values`` where ``mask`` is true; masked entries may hold NaN or inf."""
    kept = torch.where(mask, values, torch.zeros_like(values))
    return kept.sum() if dim is None else kept.sum(dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``values`` over ``mask`` (0 where nothing is kept)."""
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1)


def as_bool_mask(mask: Tensor, like: Tensor) -> Tensor:
    """A 0/1 float or bool ``mask`` as bool, checked against the shape of ``like``."""
    if mask.shape != like.shape:
        raise ValueError(f"mask has shape {tuple(mask.shape)}, expected {tuple(like.shape)}")
    return mask if mask.dtype == torch.bool else mask != 0
