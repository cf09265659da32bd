"""Which samples enter the loss, and DAPO's length shaping.

From "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (Yu et al., 2025):
dynamic sampling drops groups whose rewards are all equal (their group-relative advantages are
all 0: no signal, but they still dilute the token mean); overlong filtering masks truncated
samples out of the loss; soft overlong punishment adds a length penalty near the limit.
"""

from __future__ import annotations

import torch
from torch import Tensor

from envhub.errors import ConfigError


def zero_variance_groups(rewards: Tensor, group_ids: Tensor, *, tol: float = 1e-8) -> Tensor:
    """``keep (N,) bool``: False for every sample of a group whose rewards all lie within ``tol``.

    A group of one sample has no spread and is dropped too.

    Args:
        rewards: ``(N,)`` rewards.
        group_ids: ``(N,)`` integer group ids.
        tol: Largest ``max - min`` of a group that still counts as "all equal".
    """
    if rewards.dim() != 1 or rewards.shape != group_ids.shape:
        raise ValueError("rewards and group_ids must both have shape (N,)")
    _, index = torch.unique(group_ids, return_inverse=True)
    groups = int(index.max()) + 1 if index.numel() else 0
    rewards = rewards.double()
    start = rewards.new_zeros(groups)
    high = start.scatter_reduce(0, index, rewards, "amax", include_self=False)
    low = start.scatter_reduce(0, index, rewards, "amin", include_self=False)
    return (high - low)[index] > tol


def overlong_penalty(lengths: Tensor, max_length: int, buffer: int) -> Tensor:
    """DAPO's soft overlong punishment, ``(N,)`` float, added to the reward.

    ``0`` for ``L <= max_length - buffer``, ``(max_length - buffer - L) / buffer`` (from 0 down
    to -1) for ``max_length - buffer < L <= max_length``, and ``-1`` beyond ``max_length``.

    Args:
        lengths: ``(N,)`` response lengths in tokens.
        max_length: The response token budget.
        buffer: Tokens before ``max_length`` where the penalty starts, ``0 < buffer <= max_length``.

    Raises:
        ConfigError: ``buffer`` out of range.
    """
    if not 0 < buffer <= max_length:
        raise ConfigError(
            f"need 0 < buffer <= max_length, got buffer={buffer}, max_length={max_length}"
        )
    lengths = lengths.to(torch.float32)
    ramp = (max_length - buffer - lengths) / buffer
    penalty = torch.where(lengths > max_length - buffer, ramp, torch.zeros_like(lengths))
    return torch.where(lengths > max_length, torch.full_like(lengths, -1.0), penalty)


def overlong_filter_mask(truncated: Tensor) -> Tensor:
    """``keep (N,) bool``: False for samples cut off by the length limit (overlong filtering)."""
    return ~truncated.bool()
