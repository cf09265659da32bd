"""Per-sequence advantages from one scalar reward per sample.

Every estimator takes flat ``rewards (N,)`` and ``group_ids (N,)``: samples of the same task share
a group id (any integers; groups may differ in size). The advantage of a sequence is broadcast to
all of its tokens by the policy loss. All estimators here are outcome-only: no value network
(``remax``'s baseline is a greedy episode's reward).
``returns.per_turn_advantages`` applies the group and batch estimators to per-turn returns
instead (``credit: turn``); ``returns.gae`` is the estimator for a critic's values.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from envhub.errors import ConfigError

from .registry import ADVANTAGES, outcome_estimators

AdvantageEstimator = Callable[..., Tensor]
"""An outcome estimator's signature: ``(rewards (N,), group_ids (N,), **inputs) -> (N,)``."""


def _check(rewards: Tensor, group_ids: Tensor) -> Tensor:
    if rewards.dim() != 1 or rewards.shape != group_ids.shape:
        raise ValueError(
            f"rewards and group_ids must both have shape (N,), got {tuple(rewards.shape)} "
            f"and {tuple(group_ids.shape)}"
        )
    return rewards if rewards.is_floating_point() else rewards.float()


def group_stats(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Each sample's group mean, unbiased group std (0 for a group of one) and group size.

    Args:
        rewards: ``(N,)`` float rewards.
        group_ids: ``(N,)`` integer group ids.

    Returns:
        Three ``(N,)`` tensors: mean, std, size, each taken over the sample's own group.
    """
    rewards = _check(rewards, group_ids)
    _, index = torch.unique(group_ids, return_inverse=True)
    groups = int(index.max()) + 1 if index.numel() else 0
    size = torch.zeros(groups, dtype=rewards.dtype, device=rewards.device).index_add_(
        0, index, torch.ones_like(rewards)
    )
    mean = torch.zeros_like(size).index_add_(0, index, rewards) / size
    squares = torch.zeros_like(size).index_add_(0, index, (rewards - mean[index]) ** 2)
    # Bessel's correction (n - 1), like TRL and verl; a group of one has no spread.
    std = (squares / (size - 1).clamp(min=1)).sqrt()
    return mean[index], std[index], size[index]


def grpo(
    rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6, scale_by_std: bool = True
) -> Tensor:
    """GRPO: ``(r - group mean) / (group std + eps)``.

    From "DeepSeekMath" (Shao et al., 2024), outcome supervision. The std is the unbiased one; a
    group of one gets 0. ``scale_by_std=False`` drops the division, which is Dr.GRPO (see
    :func:`dr_grpo`): dividing by the std up-weights groups that are almost all right or all wrong.
    """
    mean, std, size = group_stats(rewards, group_ids)
    centred = rewards - mean
    if not scale_by_std:
        return centred
    # A group of one is 0 even with eps=0 (its 0/0 would be NaN).
    return torch.where(size > 1, centred / (std + eps), torch.zeros_like(centred))


def dr_grpo(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Dr.GRPO: ``r - group mean``.

    From "Understanding R1-Zero-Like Training: A Critical Perspective" (Liu et al., 2025), which
    removes GRPO's std scaling (and its length normalisation, which is the aggregation's job here:
    ``seq-mean-token-sum-norm``).
    """
    mean, _, _ = group_stats(rewards, group_ids)
    return rewards - mean


def rloo(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """RLOO: ``r_i - mean of the other samples of the group`` = ``n/(n-1) (r_i - group mean)``.

    From "Buy 4 REINFORCE Samples, Get a Baseline for Free!" (Kool et al., 2019) and "Back to
    Basics: Revisiting REINFORCE Style Optimization" (Ahmadian et al., 2024). Leaving the sample
    out keeps the baseline independent of it (an unbiased gradient); a group of one gets 0.
    """
    mean, _, size = group_stats(rewards, group_ids)
    return (rewards - mean) * size / (size - 1).clamp(min=1)


def _whiten(values: Tensor, eps: float) -> Tensor:
    if values.numel() < 2:
        return torch.zeros_like(values)
    return (values - values.mean()) / (values.std() + eps)


def reinforce_pp(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6) -> Tensor:
    """REINFORCE++: the rewards whitened over the whole batch, ``(r - mean) / (std + eps)``.

    From "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models" (Hu,
    2025). Simplified: the paper folds a per-token KL penalty into the return before whitening;
    here the KL is a separate loss term (``kl_beta``), so only the outcome reward is whitened.
    ``group_ids`` are ignored. The std is unbiased; a batch of one gets 0.
    """
    return _whiten(_check(rewards, group_ids), eps)


def reinforce_pp_baseline(rewards: Tensor, group_ids: Tensor, *, eps: float = 1e-6) -> Tensor:
    """REINFORCE++-baseline: subtract the group mean, then whiten over the whole batch.

    From the REINFORCE++ paper's variant for reasoning tasks with several samples per prompt (Hu,
    2025): the group mean removes the prompt's difficulty, the batch whitening sets the scale
    without GRPO's per-group std. Same simplification as :func:`reinforce_pp` for the KL.
    """
    mean, _, _ = group_stats(rewards, group_ids)
    return _whiten(rewards - mean, eps)


def opo(rewards: Tensor, group_ids: Tensor, *, lengths: Tensor | None = None) -> Tensor:
    """OPO: ``r - b`` with the length-weighted group mean ``b = sum(l_j r_j) / sum(l_j)``.

    From "On-Policy RL with Optimal Reward Baseline" (Hao et al., 2025): for a sequence-level
    reward and a loss summed over tokens, the variance-minimising baseline weights each
    sample's reward by its gradient's size, which grows with its length ``l`` (the tokens the
    policy sampled). The baseline includes the sample itself, so a group of one gets 0 (verl
    leaves its reward unbaselined instead).

    Args:
        rewards: ``(N,)`` float rewards.
        group_ids: ``(N,)`` integer group ids.
        lengths: ``(N,)`` tokens each sample's policy sampled (the loss's tokens); ``None``:
            all equal, which makes the baseline the group mean (Dr.GRPO).
    """
    rewards = _check(rewards, group_ids)
    if lengths is None:
        lengths = torch.ones_like(rewards)
    if lengths.shape != rewards.shape:
        raise ValueError(f"lengths {tuple(lengths.shape)} != rewards {tuple(rewards.shape)}")
    lengths = lengths.to(rewards.dtype)
    _, index = torch.unique(group_ids, return_inverse=True)
    groups = int(index.max()) + 1 if index.numel() else 0
    weight = torch.zeros(groups, dtype=rewards.dtype, device=rewards.device)
    weight = weight.index_add_(0, index, lengths)
    weighted = torch.zeros_like(weight).index_add_(0, index, lengths * rewards)
    mean, _, _ = group_stats(rewards, group_ids)
    baseline = torch.where(weight[index] > 0, weighted[index] / weight[index].clamp(min=1), mean)
    return rewards - baseline


def gpg(
    rewards: Tensor, group_ids: Tensor, *, scale_by_std: bool = False, eps: float = 1e-6
) -> Tensor:
    """GPG: ``alpha * (r - group mean)``, ``alpha = N / N_valid``.

    From "GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning" (Chu et
    al., 2025). A group whose rewards are all equal has advantage 0 everywhere and adds nothing
    to the gradient but still counts in the batch's mean; ``alpha`` (the paper's accurate
    gradient estimation) scales the others back up: ``N`` is the number of samples,
    ``N_valid`` those in groups whose rewards differ (``alpha = 1`` when none do). The paper's
    ``F_norm`` is 1 (no std division); ``scale_by_std=True`` divides by the group std as GRPO
    does. verl counts the samples with a non-zero reward as ``N_valid``; the paper and its
    code count the samples of groups with a non-zero std, as here.
    """
    mean, std, size = group_stats(rewards, group_ids)
    valid = (size > 1) & (std > 0)
    alpha = rewards.numel() / max(int(valid.sum()), 1)
    centred = rewards - mean
    if scale_by_std:
        centred = torch.where(valid, centred / (std + eps), torch.zeros_like(centred))
    return alpha * centred


def remax(rewards: Tensor, group_ids: Tensor, *, baselines: Tensor | None = None) -> Tensor:
    """ReMax: ``r - b``, ``b`` the reward of a greedy episode of the same task.

    From "ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for Aligning
    Large Language Models" (Li et al., 2024): the greedy response's reward is a baseline that
    does not depend on the sampled one, so the gradient stays unbiased, and it needs neither a
    critic nor several samples per task. A sample whose baseline is missing (``nan``: its
    greedy episode failed outside the policy's control) gets 0.

    Args:
        rewards: ``(N,)`` float rewards.
        group_ids: ``(N,)`` integer group ids (unused: the baseline is per sample).
        baselines: ``(N,)`` the greedy episode's reward for each sample's task; ``None``:
            none is known (every advantage 0).
    """
    rewards = _check(rewards, group_ids)
    if baselines is None:
        return torch.zeros_like(rewards)
    if baselines.shape != rewards.shape:
        raise ValueError(f"baselines {tuple(baselines.shape)} != rewards {tuple(rewards.shape)}")
    baselines = baselines.to(rewards.dtype)
    return torch.where(baselines.isnan(), torch.zeros_like(rewards), rewards - baselines)


def compute_advantages(name: str, rewards: Tensor, group_ids: Tensor, **kwargs: object) -> Tensor:
    """Advantages by the outcome estimator registered as ``name`` (``registry.ADVANTAGES``).

    Args:
        name: ``grpo``, ``dr_grpo``, ``rloo``, ``reinforce++``, ``reinforce++_baseline``,
            ``opo`` (needs ``lengths=``), ``gpg``, ``remax`` (needs ``baselines=``) or one
            registered since.
        rewards: ``(N,)`` float rewards.
        group_ids: ``(N,)`` integer group ids; samples of one task share an id.
        **kwargs: Estimator options, e.g. ``eps`` or ``scale_by_std`` for ``grpo``, ``lengths``
            for ``opo``.

    Raises:
        ConfigError: ``name`` is not registered, or needs a critic's values (``gae``: see
            ``trainer/scoring.estimate_advantages``).
    """
    if name in ADVANTAGES and ADVANTAGES[name].needs_critic:
        raise ConfigError(
            f"advantage {name!r} needs a critic's values, not only rewards: "
            "trainer/scoring.estimate_advantages estimates it"
        )
    if name not in outcome_estimators():
        raise ConfigError(ADVANTAGES.unknown(name, outcome_estimators()))
    return ADVANTAGES.function(name)(rewards, group_ids, **kwargs)
