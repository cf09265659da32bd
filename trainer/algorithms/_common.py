"""Helpers shared by the algorithm modules: registry look-up and masked reductions."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import TypeVar

import torch
from torch import Tensor

from envhub.errors import ConfigError

T = TypeVar("T")

# Log-ratios are clamped before exp: e^20 ~ 5e8 is far past any clip range, and an overflow to
# inf would turn the zero gradient of a clipped branch into 0 * inf = NaN.
MAX_LOG_RATIO = 20.0


def lookup(registry: Mapping[str, T], name: str, what: str) -> T:
    """``registry[name]``, or a ConfigError that lists the valid names and the nearest one."""
    try:
        return registry[name]
    except KeyError:
        close = difflib.get_close_matches(str(name), list(registry), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        valid = ", ".join(sorted(registry))
        raise ConfigError(f"unknown {what} {name!r}{hint}; valid: {valid}") from None


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
