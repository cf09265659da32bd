"""The whole RL objective of one micro-batch, assembled from the parts in this package.

Order: mismatch correction (its weights multiply the per-token policy loss, its keep mask
narrows the mask) -> policy loss -> ``+ kl_beta * KL`` -> ``- entropy_coef * entropy`` ->
aggregation with the WHOLE batch's token and sequence counts, so the sum over micro-batches is
the batch's loss.

Supervised tokens (demonstrations: a warm start's, or the auxiliary term during RL) ride in the
same micro-batches: where ``supervised`` holds a weight ``w > 0`` the token's loss is the
cross-entropy ``-w * logprob`` instead of the policy loss, and the mismatch correction and the
policy loss's metrics see only the other tokens. A batch without supervised tokens computes
exactly what it computed before they existed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from envhub.errors import ConfigError
from envhub.trainer.config import AlgorithmConfig

from ._common import as_bool_mask, masked_mean, masked_sum
from .aggregation import Count, aggregate
from .kl import kl_penalty
from .mismatch import mismatch_weights
from .policy_losses import check_clip_range
from .registry import AGGREGATIONS, KL_ESTIMATORS, MISMATCH_MODES, POLICY_LOSSES

_ALGORITHM = AlgorithmConfig()
"""The config's ``algorithm`` section as it is by default: where the objective's defaults are
written (and documented); :class:`ObjectiveSpec` takes its own from it."""


@dataclass(frozen=True)
class ObjectiveSpec:
    """What :func:`policy_objective` computes; checked when it is built. The trainer builds
    it from the config (``objective_spec``); each default is the config's (``norm_length``'s
    ``None``: no length normaliser).

    Attributes:
        policy_loss: A name in ``POLICY_LOSSES``.
        eps_low: Lower clip range (set ~3e-4 for ``gspo``).
        eps_high: Upper clip range (set ~4e-4 for ``gspo``).
        dual_clip: ``c > 1`` caps negative-advantage losses at ``-c*A``; ``None`` disables.
        aggregation: A name in ``AGGREGATIONS``.
        norm_length: The constant length for ``seq-mean-token-sum-norm``.
        kl_beta: Weight of the KL penalty to the reference model; 0 needs no reference.
        kl_estimator: A name in ``KL_ESTIMATORS``.
        entropy_coef: Weight of the entropy bonus; non-zero needs ``entropy``.
        mismatch: A name in ``MISMATCH_MODES``; applied when sampler log-probs are given.
        mismatch_cap: Truncation of the ``tis`` weight.
        mismatch_low: Lower accepted sampler/trainer ratio for the mask modes.
        mismatch_high: Upper accepted ratio for the mask modes.
    """

    policy_loss: str = _ALGORITHM.policy_loss
    eps_low: float = _ALGORITHM.eps_low
    eps_high: float = _ALGORITHM.eps_high
    dual_clip: float | None = _ALGORITHM.dual_clip
    aggregation: str = _ALGORITHM.aggregation
    norm_length: int | None = None
    kl_beta: float = _ALGORITHM.kl_beta
    kl_estimator: str = _ALGORITHM.kl_estimator
    entropy_coef: float = _ALGORITHM.entropy_coef
    mismatch: str = _ALGORITHM.mismatch
    mismatch_cap: float = _ALGORITHM.mismatch_cap
    mismatch_low: float = _ALGORITHM.mismatch_low
    mismatch_high: float = _ALGORITHM.mismatch_high

    def __post_init__(self) -> None:
        POLICY_LOSSES.entry(self.policy_loss)
        AGGREGATIONS.entry(self.aggregation)
        KL_ESTIMATORS.entry(self.kl_estimator)
        MISMATCH_MODES.entry(self.mismatch)
        check_clip_range(self.eps_low, self.eps_high, self.dual_clip)
        if self.aggregation == "seq-mean-token-sum-norm" and not (self.norm_length or 0) > 0:
            raise ConfigError("aggregation 'seq-mean-token-sum-norm' needs norm_length > 0")
        if self.kl_beta < 0:
            raise ConfigError(f"kl_beta must be >= 0, got {self.kl_beta}")
        if self.mismatch_cap <= 0 or not 0 <= self.mismatch_low <= 1 <= self.mismatch_high:
            raise ConfigError("need mismatch_cap > 0 and 0 <= mismatch_low <= 1 <= mismatch_high")


def policy_objective(
    spec: ObjectiveSpec,
    *,
    logprobs: Tensor,
    old_logprobs: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    num_tokens: Count,
    num_sequences: Count,
    sampler_logprobs: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    entropy: Tensor | None = None,
    supervised: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The scalar loss of one micro-batch and its metrics.

    Args:
        spec: The objective.
        logprobs: ``(B,T)`` the trained policy's log-probs of the sampled tokens (with grad).
        old_logprobs: ``(B,T)`` the trainer's log-probs before the update; ``None`` means a
            single on-policy update (``logprobs.detach()``: ratio 1, the policy gradient).
        advantages: ``(B,)`` or ``(B,T)``.
        mask: ``(B,T)`` 1 on the tokens the policy sampled.
        num_tokens: Loss tokens in the whole batch (counted on ``mask``, before mismatch masking:
            dropped tokens count as zero loss).
        num_sequences: Sequences in the whole batch.
        sampler_logprobs: ``(B,T)`` the inference engine's log-probs; ``None`` skips the
            mismatch correction.
        ref_logprobs: ``(B,T)`` the reference model's log-probs; required when ``kl_beta > 0``.
        entropy: ``(B,T)`` token entropies (with grad for a bonus); required when
            ``entropy_coef != 0``.
        supervised: ``(B,T)`` the cross-entropy weight of each demonstration token (0 on the
            tokens the policy sampled); ``None``: none is.

    Returns:
        ``(loss, metrics)``. Metrics (detached, masked means): the policy loss's (``clip_frac``,
        ``ratio_mean``, ...), the mismatch ones when corrected, ``policy_loss``, and ``kl`` /
        ``entropy`` when their inputs are given; with supervised tokens, ``sft_token_frac``
        (their share of the micro-batch's loss tokens) and ``sft_nll_per_token`` (their
        negative logprobs summed, per loss token: over any split into micro-batches the
        demonstrations' mean is the ratio of the two, which the trainer reports as
        ``sft_nll``).

    Raises:
        ConfigError: ``kl_beta > 0`` without ``ref_logprobs``, or ``entropy_coef != 0`` without
            ``entropy``.
    """
    if spec.kl_beta > 0 and ref_logprobs is None:
        raise ConfigError(
            "kl_beta > 0 needs ref_logprobs (load a reference model or set kl_beta 0)"
        )
    if spec.entropy_coef != 0 and entropy is None:
        raise ConfigError("entropy_coef != 0 needs the token entropies (pass entropy=...)")
    mask = as_bool_mask(mask, logprobs)
    demo = _supervised_mask(supervised, mask)
    if demo is not None:
        mask = mask & ~demo  # the policy loss's tokens
    old = logprobs.detach() if old_logprobs is None else old_logprobs.detach()
    metrics: dict[str, Tensor] = {}
    weights: Tensor | float = 1.0
    if sampler_logprobs is not None:
        weights, mask, mismatch_metrics = mismatch_weights(
            old,
            sampler_logprobs,
            mask,
            mode=spec.mismatch,
            cap=spec.mismatch_cap,
            low=spec.mismatch_low,
            high=spec.mismatch_high,
        )
        metrics.update(mismatch_metrics)
    policy = POLICY_LOSSES.function(spec.policy_loss)
    token_loss, policy_metrics = policy(
        logprobs,
        old,
        advantages,
        mask,
        eps_low=spec.eps_low,
        eps_high=spec.eps_high,
        dual_clip=spec.dual_clip,
    )
    token_loss = token_loss * weights
    metrics.update(policy_metrics)
    with torch.no_grad():
        metrics["policy_loss"] = masked_mean(token_loss, mask)
    if demo is not None:
        assert supervised is not None
        token_loss, mask = _add_supervised(token_loss, mask, logprobs, supervised, demo, metrics)
    if ref_logprobs is not None:
        kl = kl_penalty(spec.kl_estimator, logprobs, ref_logprobs, mask)
        metrics["kl"] = masked_mean(kl.detach(), mask)
        if spec.kl_beta > 0:
            token_loss = token_loss + spec.kl_beta * kl
    if entropy is not None:
        entropy = torch.where(mask, entropy, torch.zeros_like(entropy))
        metrics["entropy"] = masked_mean(entropy.detach(), mask)
        if spec.entropy_coef != 0:
            token_loss = token_loss - spec.entropy_coef * entropy
    loss = aggregate(
        token_loss,
        mask,
        spec.aggregation,
        num_tokens=num_tokens,
        num_sequences=num_sequences,
        norm_length=spec.norm_length,
    )
    return loss, metrics


def _supervised_mask(supervised: Tensor | None, mask: Tensor) -> Tensor | None:
    """Where the loss is the demonstrations' cross-entropy (``None``: nowhere)."""
    if supervised is None:
        return None
    if supervised.shape != mask.shape:
        raise ValueError(
            f"supervised has shape {tuple(supervised.shape)}, expected {tuple(mask.shape)}"
        )
    return mask & (supervised > 0)


def _add_supervised(
    token_loss: Tensor,
    policy_mask: Tensor,
    logprobs: Tensor,
    supervised: Tensor,
    demo: Tensor,
    metrics: dict[str, Tensor],
) -> tuple[Tensor, Tensor]:
    """The token losses with ``-w * logprob`` on the demonstration tokens, and the mask of
    every token in the loss (the policy's and the demonstrations')."""
    nll = -logprobs
    token_loss = torch.where(demo, supervised.to(nll.dtype) * nll, token_loss)
    full = policy_mask | demo
    with torch.no_grad():
        # Per loss token of the micro-batch, as every metric is weighted by those counts: the
        # demonstrations' mean is sft_nll_per_token / sft_token_frac over any split.
        tokens = full.sum().clamp(min=1)
        metrics["sft_nll_per_token"] = masked_sum(nll.detach(), demo) / tokens
        metrics["sft_token_frac"] = demo.sum() / tokens
    return token_loss, full
