"""Correct for the gap between the sampler's and the trainer's log-probs of the same tokens.

The inference engine (vLLM, ...) samples with its own kernels and precision; the trainer
recomputes the log-probs of those tokens before the update. Even with identical weights the two
differ, so the "on-policy" update is slightly off-policy. Following "Your Efficient RL Framework
Secretly Brings You Off-Policy RL Training" (Yao et al., 2025, truncated importance sampling) and
the masking variants used since (token- and sequence-level rejection), the ratio
``trainer / sampler`` either reweights the policy loss or masks tokens / sequences out of it.
Weights carry no gradient.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from envhub.errors import ConfigError

from ._common import MAX_LOG_RATIO, as_bool_mask, masked_mean
from .registry import MISMATCH_MODES

# (ratio, log_ratio, mask, cap, low, high) -> (weights, keep, truncated)
_Weighting = tuple[Tensor, Tensor, Tensor]
MismatchMode = Callable[..., _Weighting]
"""A mismatch correction's signature (``registry.MISMATCH_MODES``)."""


def _tis(ratio: Tensor, log_ratio: Tensor, mask: Tensor, cap: float, **_: float) -> _Weighting:
    truncated = mask & (ratio > cap)
    return ratio.clamp(max=cap), mask, truncated


def _mask_token(
    ratio: Tensor, log_ratio: Tensor, mask: Tensor, low: float, high: float, **_: float
) -> _Weighting:
    keep = mask & (ratio >= low) & (ratio <= high)
    return torch.ones_like(ratio), keep, torch.zeros_like(mask)


def _mask_sequence(
    ratio: Tensor, log_ratio: Tensor, mask: Tensor, low: float, high: float, **_: float
) -> _Weighting:
    # Geometric mean of the token ratios = exp of the mean log-ratio over the sequence's tokens.
    seq_ratio = masked_mean(log_ratio, mask, dim=-1).exp()
    keep = mask & ((seq_ratio >= low) & (seq_ratio <= high))[:, None]
    return torch.ones_like(ratio), keep, torch.zeros_like(mask)


def _none(ratio: Tensor, log_ratio: Tensor, mask: Tensor, **_: float) -> _Weighting:
    return torch.ones_like(ratio), mask, torch.zeros_like(mask)


def mismatch_weights(
    trainer_logprobs: Tensor,
    sampler_logprobs: Tensor,
    mask: Tensor,
    *,
    mode: str = "tis",
    cap: float = 2.0,
    low: float = 0.5,
    high: float = 2.0,
) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """Per-token weights and keep mask from the ratio ``exp(trainer - sampler)``.

    Args:
        trainer_logprobs: ``(B,T)`` the trainer's log-probs of the sampled tokens (the old
            policy, recomputed before the update).
        sampler_logprobs: ``(B,T)`` the inference engine's log-probs of the same tokens.
        mask: ``(B,T)`` 1 on tokens that count.
        mode: ``tis`` (weight ``min(ratio, cap)``), ``mask-token`` (drop tokens whose ratio is
            outside ``[low, high]``), ``mask-sequence`` (drop sequences whose geometric-mean
            ratio is outside ``[low, high]``) or ``none``.
        cap: Truncation of the ``tis`` weight.
        low: Lower bound of the accepted ratio for the mask modes.
        high: Upper bound of the accepted ratio for the mask modes.

    Returns:
        ``(weights, keep_mask, metrics)``: ``weights`` (1 where not reweighted) multiply the
        per-token policy loss, ``keep_mask`` (bool, within ``mask``) replaces the mask. Metrics
        over ``mask``: ``mismatch_kl`` (k3 estimate of KL(sampler || trainer)),
        ``mismatch_abs_logprob_diff_mean``/``_max``, ``mismatch_ratio_mean``,
        ``mismatch_masked_frac`` (tokens dropped), ``mismatch_truncated_frac`` (tokens whose
        ``tis`` weight was capped).

    Raises:
        ConfigError: Unknown ``mode``, ``cap <= 0``, or not ``0 <= low <= 1 <= high``.
    """
    reweight = MISMATCH_MODES.function(mode)
    if cap <= 0 or not 0 <= low <= 1 <= high:
        raise ConfigError(
            f"need cap > 0 and 0 <= low <= 1 <= high, got cap={cap}, low={low}, high={high}"
        )
    mask = as_bool_mask(mask, trainer_logprobs)
    with torch.no_grad():
        diff = torch.where(
            mask, trainer_logprobs - sampler_logprobs, torch.zeros_like(trainer_logprobs)
        )
        log_ratio = diff.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
        ratio = log_ratio.exp()
        weights, keep, truncated = reweight(ratio, log_ratio, mask, cap=cap, low=low, high=high)
        metrics = _metrics(diff, ratio, log_ratio, mask, keep, truncated)
    return weights, keep, metrics


def _metrics(
    diff: Tensor, ratio: Tensor, log_ratio: Tensor, mask: Tensor, keep: Tensor, truncated: Tensor
) -> dict[str, Tensor]:
    abs_diff = diff.abs()
    # Samples come from the sampler, so k3 with r = trainer / sampler estimates
    # KL(sampler || trainer).
    # k3 is never negative; float32 rounding of exp(x) - x - 1 for tiny x can be (-1e-9).
    kl = (ratio - log_ratio - 1).clamp(min=0)
    dtype = ratio.dtype
    return {
        "mismatch_kl": masked_mean(kl, mask),
        "mismatch_abs_logprob_diff_mean": masked_mean(abs_diff, mask),
        "mismatch_abs_logprob_diff_max": abs_diff.max() if abs_diff.numel() else abs_diff.sum(),
        "mismatch_ratio_mean": masked_mean(ratio, mask),
        "mismatch_masked_frac": masked_mean((mask & ~keep).to(dtype), mask),
        "mismatch_truncated_frac": masked_mean(truncated.to(dtype), mask),
    }
