"""Per-token estimators of KL(pi || ref) from the log-probs of tokens sampled from pi.

From John Schulman's note "Approximating KL Divergence" (2020). With ``log_r = ref - logp``:
``k1 = -log_r`` (unbiased, high variance, can be negative), ``k2 = 0.5 * log_r^2`` (biased, low
variance), ``k3 = exp(log_r) - log_r - 1`` (unbiased and always >= 0; GRPO's penalty).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ._common import MAX_LOG_RATIO, as_bool_mask
from .registry import KL_ESTIMATORS

KLEstimator = Callable[[Tensor, Tensor], Tensor]
"""A KL estimator's signature (``registry.KL_ESTIMATORS``): ``(logprobs, ref) -> (B,T)``."""


def k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """``logp - ref``."""
    return logprobs - ref_logprobs


def k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """``0.5 * (logp - ref)^2``."""
    return 0.5 * (logprobs - ref_logprobs) ** 2


def k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """``exp(ref - logp) - (ref - logp) - 1``; the log-ratio is clamped to +-20 before exp."""
    log_r = (ref_logprobs - logprobs).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    return log_r.exp() - log_r - 1


def kl_penalty(
    name: str, logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor | None = None
) -> Tensor:
    """Per-token KL estimate ``(B,T)`` by the estimator ``name``, 0 where ``mask`` is 0.

    Args:
        name: ``k1``, ``k2`` or ``k3``.
        logprobs: ``(B,T)`` log-probs of the sampled tokens under the policy (with grad).
        ref_logprobs: ``(B,T)`` log-probs under the reference model (treated as constants).
        mask: Optional ``(B,T)`` 0/1 mask; masked positions get 0 and no gradient.

    Raises:
        ConfigError: ``name`` is not registered.
    """
    estimator = KL_ESTIMATORS.function(name)
    ref_logprobs = ref_logprobs.detach()
    if mask is None:
        return estimator(logprobs, ref_logprobs)
    mask = as_bool_mask(mask, logprobs)
    zeros = torch.zeros_like(logprobs)
    # Zero the inputs first, not just the output: garbage there must not reach the gradient.
    values = estimator(torch.where(mask, logprobs, zeros), torch.where(mask, ref_logprobs, zeros))
    return torch.where(mask, values, zeros)
