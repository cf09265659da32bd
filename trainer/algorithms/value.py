"""The critic's side of PPO: the clipped value loss, explained variance, and advantage whitening.

The value loss is PPO's (Schulman et al., 2017, as in its baselines and verl):

    L = 1/2 * max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2)

per token, where ``R`` is the return GAE gave (``advantage + V_old``) and ``V_old`` the critic's
value when the rollouts were scored. The clipped branch keeps one update from moving a value
further than ``c`` from where it started; ``c = None`` is the plain squared error. The token
losses are summed and divided by the whole update's count of value tokens, so accumulating the
gradients of micro-batches gives the whole update's gradient however it is split (as for the
policy, see ``aggregation``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._common import as_bool_mask, masked_mean, masked_sum


def clipped_value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip: float | None,
    num_tokens: int | float,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's value loss of one micro-batch, normalised by the whole update's token count.

    Args:
        values: ``(B, T)`` the critic's values now (with gradients).
        old_values: ``(B, T)`` its values when the rollouts were scored.
        returns: ``(B, T)`` the targets (GAE's returns).
        mask: ``(B, T)`` 1 on the places the critic is trained on.
        clip: ``c``: how far a value may move from ``old_values`` before the clipped branch
            takes over; ``None``: no clipping.
        num_tokens: Value places in the whole update (all micro-batches, all ranks).

    Returns:
        The loss, and metrics of this micro-batch (means over its masked places): ``clip_frac``
        (places where the clipped branch is the larger), ``error`` (mean squared error of the
        unclipped values).
    """
    mask = as_bool_mask(mask, values)
    unclipped = (values - returns) ** 2
    loss = unclipped
    clipped_frac = torch.zeros((), dtype=values.dtype, device=values.device)
    if clip is not None:
        moved = old_values + (values - old_values).clamp(-clip, clip)
        clipped = (moved - returns) ** 2
        loss = torch.maximum(unclipped, clipped)
        clipped_frac = masked_mean((clipped > unclipped).to(values.dtype), mask)
    total = 0.5 * masked_sum(loss, mask) / max(num_tokens, 1)
    metrics = {"clip_frac": clipped_frac.detach(), "error": masked_mean(unclipped, mask).detach()}
    return total, metrics


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor | None = None) -> float:
    """``1 - Var(R - V) / Var(R)`` over the masked places: 1 is a perfect critic, 0 one no better
    than a constant, negative a worse one. ``nan`` when the returns do not vary (nothing to
    explain).

    Args:
        values: The critic's values.
        returns: The returns they predict, shaped like ``values``.
        mask: Optional 0/1 like ``values``; all places when ``None``.
    """
    mask = torch.ones_like(values, dtype=torch.bool) if mask is None else as_bool_mask(mask, values)
    r, v = returns[mask].double(), values[mask].double()
    if r.numel() < 2:
        return float("nan")
    spread = r.var(unbiased=False)
    if spread <= 0:
        return float("nan")
    return float(1.0 - (r - v).var(unbiased=False) / spread)


def masked_whiten(values: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """``(x - mean) / (std + eps)`` with mean and (biased) std over the masked places; masked-out
    places are 0. Fewer than two places: all 0 (nothing to scale against)."""
    mask = as_bool_mask(mask, values)
    kept = values[mask]
    if kept.numel() < 2:
        return torch.zeros_like(values)
    mean, std = kept.mean(), kept.std(unbiased=False)
    return torch.where(mask, (values - mean) / (std + eps), torch.zeros_like(values))
