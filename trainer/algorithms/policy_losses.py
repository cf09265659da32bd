"""Per-token policy losses (to be minimised) with their clipping metrics.

Every loss takes ``logprobs (B,T)`` of the policy being trained (with grad), ``old_logprobs (B,T)``
of the behaviour policy (treated as constants), ``advantages`` of shape ``(B,)`` (broadcast over
tokens) or ``(B,T)``, and a 0/1 ``mask (B,T)``. It returns ``(token_loss (B,T), metrics)``:
``token_loss`` is exactly 0 on masked positions and masked positions get no gradient even when
their logprobs are NaN or inf (everything goes through ``torch.where``, never a multiply by 0).
Metrics are detached masked means over the tokens of this call.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from envhub.errors import ConfigError

from ._common import MAX_LOG_RATIO, as_bool_mask, masked_mean
from .registry import POLICY_LOSSES

PolicyLoss = Callable[..., tuple[Tensor, dict[str, Tensor]]]
"""A policy loss's signature (``registry.POLICY_LOSSES``): ``(logprobs, old_logprobs, advantages,
mask, *, eps_low, eps_high, dual_clip) -> (token_loss, metrics)``."""


def _inputs(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """The behaviour log-prob, the advantages as ``(B,T)``, and the mask as bool."""
    if old_logprobs.shape != logprobs.shape:
        raise ValueError(
            f"old_logprobs {tuple(old_logprobs.shape)} != logprobs {tuple(logprobs.shape)}"
        )
    mask = as_bool_mask(mask, logprobs)
    advantages = advantages.detach()
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    # Padding may hold NaN advantages; zero them so no NaN reaches even an unused branch.
    advantages = torch.where(mask, advantages.expand_as(logprobs), torch.zeros_like(logprobs))
    return old_logprobs.detach(), advantages, mask


def check_clip_range(eps_low: float, eps_high: float, dual_clip: float | None) -> None:
    """Raise ConfigError unless ``0 <= eps_low < 1``, ``eps_high >= 0`` and ``dual_clip > 1``."""
    if not 0 <= eps_low < 1 or eps_high < 0:
        raise ConfigError(f"need 0 <= eps_low < 1 and eps_high >= 0, got {eps_low} and {eps_high}")
    if dual_clip is not None and dual_clip <= 1:
        raise ConfigError(f"dual_clip must be > 1 (or None to disable), got {dual_clip}")


def clipped_surrogate(
    ratio: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """``-min(ratio*A, clip(ratio, 1-eps_low, 1+eps_high)*A)``, optionally capped at ``-c*A``.

    The shared core of :func:`ppo_clip` and :func:`gspo`; ``ratio`` must be finite everywhere.
    """
    check_clip_range(eps_low, eps_high, dual_clip)
    unclipped = -ratio * advantages
    clipped = -ratio.clamp(1 - eps_low, 1 + eps_high) * advantages
    loss = torch.maximum(unclipped, clipped)
    # Where the clipped branch wins, the gradient is zero: count those tokens by side.
    low = (ratio < 1 - eps_low) & (advantages < 0)
    high = (ratio > 1 + eps_high) & (advantages > 0)
    metrics = {"clip_frac_low": low, "clip_frac_high": high, "clip_frac": low | high}
    if dual_clip is not None:
        # Dual-clip PPO: for A < 0 a huge ratio would give an unbounded loss; cap it at -c*A.
        cap = -dual_clip * advantages
        capped = (advantages < 0) & (loss > cap)
        loss = torch.where(capped, cap, loss)
        metrics["dual_clip_frac"] = capped
    token_loss = torch.where(mask, loss, torch.zeros_like(loss))
    with torch.no_grad():
        out = {name: masked_mean(flag.to(ratio.dtype), mask) for name, flag in metrics.items()}
        out["ratio_mean"] = masked_mean(ratio, mask)
    return token_loss, out


def ppo_clip(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    dual_clip: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's clipped surrogate per token, with separate lower and upper clip ranges.

    From "Proximal Policy Optimization Algorithms" (Schulman et al., 2017); the decoupled
    ``eps_low``/``eps_high`` ("clip-higher", 0.2/0.28) is from DAPO (Yu et al., 2025) and
    ``dual_clip`` (c > 1) from "Mastering Complex Control in MOBA Games with Deep RL" (Ye et al.,
    2020). The log-ratio is clamped to +-20 before ``exp``, which only touches tokens that are
    clipped anyway (or capped by the dual clip).

    Args:
        logprobs: ``(B,T)`` log-probs of the sampled tokens under the trained policy.
        old_logprobs: ``(B,T)`` log-probs under the behaviour policy (no grad).
        advantages: ``(B,)`` or ``(B,T)``.
        mask: ``(B,T)`` 1 on tokens that count.
        eps_low: Lower clip range, the ratio is clipped at ``1 - eps_low``.
        eps_high: Upper clip range, the ratio is clipped at ``1 + eps_high``.
        dual_clip: ``c > 1`` caps the loss of negative-advantage tokens at ``-c*A``.

    Returns:
        ``(token_loss, metrics)`` with ``clip_frac``, ``clip_frac_low``, ``clip_frac_high``,
        ``ratio_mean`` and, with ``dual_clip``, ``dual_clip_frac``.
    """
    old, advantages, mask = _inputs(logprobs, old_logprobs, advantages, mask)
    log_ratio = torch.where(mask, logprobs - old, torch.zeros_like(logprobs))
    ratio = log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO).exp()
    return clipped_surrogate(
        ratio, advantages, mask, eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip
    )


def gspo(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    dual_clip: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO: the clipped surrogate on the sequence-level ratio (GSPO-token form).

    From "Group Sequence Policy Optimization" (Zheng et al., 2025). The sequence ratio is
    ``s_i = exp(mean_t(logp - old))`` (length-normalised, so clip ranges are ~1e-4). Per token
    ``s_it = sg(s_i) * exp(logp_t - sg(logp_t))``: its value is ``s_i`` and its gradient is
    ``s_i * grad(logp_t)``, so with one advantage per sequence and a per-sequence token mean
    the gradient is GSPO's, and per-token advantages weight each token's gradient by its own
    advantage. Arguments and metrics as :func:`ppo_clip`; clipping acts on ``s_it``.
    """
    old, advantages, mask = _inputs(logprobs, old_logprobs, advantages, mask)
    zeros = torch.zeros_like(logprobs)
    seq_log_ratio = masked_mean(logprobs - old, mask, dim=-1).detach()
    token_part = torch.where(mask, logprobs - logprobs.detach(), zeros)
    log_ratio = torch.where(mask, seq_log_ratio[:, None] + token_part, zeros)
    ratio = log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO).exp()
    return clipped_surrogate(
        ratio, advantages, mask, eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip
    )


def compute_policy_loss(
    name: str,
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    **kwargs: object,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The policy loss registered as ``name`` (``registry.POLICY_LOSSES``).

    Raises:
        ConfigError: ``name`` is not registered, or its options are out of range.
    """
    loss = POLICY_LOSSES.function(name)
    return loss(logprobs, old_logprobs, advantages, mask, **kwargs)
