"""Scoring a step's rollouts: which trajectories the loss can use, their rewards and groups,
and their advantages.

Advantages are one per sequence (``credit: episode``, broadcast over its tokens), one per turn
(``credit: turn``, each turn's on its own sampled tokens, see ``trainer/credit.py``) or one per
token (``advantage: gae``, from a critic's values, see ``trainer/critic/targets.py``). Trajectories
whose ``outcome`` is a failure outside the policy's control (env, infrastructure, timeout) or that
carry no token record are not usable, and counted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from envhub.trainer.algorithms import (
    compute_advantages,
    discounted_returns,
    overlong_penalty,
    per_turn_advantages,
    zero_variance_groups,
)
from envhub.trainer.algorithms.registry import Estimator
from envhub.trainer.config import AlgorithmConfig
from envhub.trainer.credit import record_turn_spans, span_sums, spread, turn_rewards
from envhub.trainer.critic.targets import GAEResult, ValueTarget
from envhub.types import TRAINED_OUTCOMES, Trajectory


@dataclass
class Scored:
    """The step's rollouts with the reward and group of each one the loss can use."""

    trajectories: Sequence[Trajectory]
    """All of the step's rollouts, usable or not."""
    usable: list[int]
    """Indices of the trajectories the loss can use (a token record, no outside failure)."""
    rewards: torch.Tensor
    """``(len(usable),)`` float64 rewards, the overlong soft penalty included."""
    groups: torch.Tensor
    """``(len(usable),)`` group numbers (0, 1, ... in order of first appearance)."""
    kl_penalty: list[torch.Tensor] | None = None
    """With ``algorithm.kl_in_reward``: per usable trajectory, ``coef * KL`` of each token,
    aligned with its ``token_ids`` (0 where the policy did not sample), which the advantages
    take off its rewards (``rewards`` stay the env's: dynamic sampling judges those)."""

    def baselines(self) -> torch.Tensor:
        """``(len(usable),)`` each usable trajectory's ReMax baseline (the reward of the greedy
        episode of its task; ``nan`` where there is none)."""
        values = [self.trajectories[i].baseline_reward for i in self.usable]
        return torch.tensor([math.nan if v is None else v for v in values], dtype=torch.float64)

    def lengths(self) -> torch.Tensor:
        """``(len(usable),)`` tokens the policy sampled in each usable trajectory (in all its
        segments)."""
        counts = [_sampled_tokens(self.trajectories[i]) for i in self.usable]
        return torch.tensor(counts, dtype=torch.float64)


def score(
    trajectories: Sequence[Trajectory], algorithm: AlgorithmConfig, max_tokens: int
) -> Scored:
    """Rewards of the usable trajectories and their groups.

    Args:
        trajectories: The step's rollouts (groups share ``group_key``: the ``group_id``, per
            role in an episode with several).
        algorithm: Its ``overlong.soft_penalty_buffer`` shapes the rewards (DAPO) when set.
        max_tokens: The per-turn token budget (for the overlong penalty).
    """
    usable = [i for i, t in enumerate(trajectories) if _trainable(t)]
    rewards = torch.tensor([trajectories[i].reward for i in usable], dtype=torch.float64)
    buffer = algorithm.overlong.soft_penalty_buffer
    if buffer is not None and usable:
        longest_turn = torch.tensor(
            [_longest_turn(trajectories[i]) for i in usable], dtype=torch.float64
        )
        rewards = rewards + overlong_penalty(longest_turn, max_tokens, buffer)
    groups = _group_index([trajectories[i].group_key for i in usable])
    return Scored(trajectories, usable, rewards, groups)


def has_signal(group: Sequence[Trajectory], algorithm: AlgorithmConfig, max_tokens: int) -> bool:
    """Whether dynamic sampling would keep this one group: its usable rewards (shaped as
    :func:`score` shapes them) are not all equal. A task played by several roles is one group
    per role: it is kept when any of them has signal (a tied one trains on nothing anyway)."""
    scored = score(group, algorithm, max_tokens)
    keep = zero_variance_groups(scored.rewards, scored.groups)
    if any(t.role is not None for t in group):
        return bool(keep.any())
    return bool(scored.usable) and bool(keep.all())


@dataclass
class Advantages:
    """The step's advantages, one entry per usable trajectory (:func:`estimate_advantages`)."""

    sequence: torch.Tensor
    """``(len(usable),)`` each sequence's advantage (with ``credit: turn``, its first turn's)."""
    tokens: list[list[float]] | None = None
    """With ``credit: turn``: each trajectory's per-token advantages (see
    :attr:`Sample.token_advantages`)."""
    turns: torch.Tensor | None = None
    """With ``credit: turn``: every turn's advantage, flat (for the step's metrics); with
    ``advantage: gae``, every sampled token's."""
    value_targets: list[ValueTarget] | None = None
    """With ``advantage: gae``: what the critic learns on each trajectory."""
    segment_tokens: list[list[list[float]]] | None = None
    """With ``credit: turn``: per trajectory, the per-token advantages of each of its earlier
    segments (``Trajectory.segments``), laid out like theirs."""

    def abs_mean(self) -> float:
        """Mean absolute advantage, over sequences (or over turns, with ``credit: turn``)."""
        values = self.sequence if self.turns is None else self.turns
        return float(values.abs().mean()) if values.numel() else 0.0


def estimate_advantages(
    scored: Scored, algorithm: AlgorithmConfig, values: Sequence[torch.Tensor] | None = None
) -> Advantages:
    """Advantages by ``algorithm.advantage``, per group, of the usable trajectories: the one
    place the trainer picks an estimator, by what its registry entry declares.

    An outcome estimator gives, with ``credit: episode`` (the default), one advantage per
    sequence from its episode reward, with the inputs it asks for (``Estimator.inputs``); with
    ``credit: turn`` one per turn from the discounted return from that turn on (``gamma``), the
    estimator applied per turn position (``algorithm.returns.per_turn_advantages``). With KL in
    the reward, the KL penalty of a sequence's (or a turn's) tokens is taken off its reward.
    A critic estimator (``gae``) gives one per token from the critic's ``values``
    (``critic/targets.py``).

    Args:
        scored: The step's rewards and groups (:func:`score`).
        algorithm: Names the estimator and the credit.
        values: ``advantage: gae`` only: the critic's ``(L - 1,)`` values of each usable
            trajectory.
    """
    if not scored.usable:
        return Advantages(torch.zeros(0, dtype=torch.float64))
    estimator = algorithm.estimator
    if estimator.needs_critic:
        return _critic_advantages(estimator, scored, algorithm, values)
    if algorithm.credit == "turn":
        return _turn_advantages(scored, algorithm)
    rewards = scored.rewards
    if scored.kl_penalty is not None:
        rewards = rewards - torch.stack([p.sum() for p in scored.kl_penalty])
    inputs = {name: _INPUTS[name](scored) for name in estimator.inputs}
    return Advantages(compute_advantages(estimator.name, rewards, scored.groups, **inputs))


_INPUTS = {"lengths": Scored.lengths, "baselines": Scored.baselines}
"""How each of ``registry.ESTIMATOR_INPUTS`` is read off the scored step (a test checks that
every input has a reader)."""


def _critic_advantages(
    estimator: Estimator,
    scored: Scored,
    algorithm: AlgorithmConfig,
    values: Sequence[torch.Tensor] | None,
) -> Advantages:
    """A critic estimator (``gae``): per-token advantages and the critic's targets
    (``critic/targets``)."""
    if values is None or len(values) != len(scored.usable):
        raise ValueError(
            f"advantage {estimator.name} needs the critic's values of every usable trajectory"
        )
    result: GAEResult = estimator.load()(
        [scored.trajectories[i] for i in scored.usable],
        scored.rewards,
        values,
        algorithm,
        scored.kl_penalty,
    )
    first = torch.tensor(
        [first_sampled(a, scored.trajectories[i].loss_mask or []) for a, i in zip(
            result.token_advantages, scored.usable, strict=True
        )],
        dtype=torch.float64,
    )  # fmt: skip
    return Advantages(first, result.token_advantages, result.policy_tokens, result.value_targets)


def first_sampled(per_token: list[float], mask: list[int]) -> float:
    """The advantage of the first token the policy sampled (its first turn's), of a record
    whose loss mask is ``mask``."""
    return next((a for a, m in zip(per_token, mask, strict=True) if m), 0.0)


def _turn_advantages(scored: Scored, algorithm: AlgorithmConfig) -> Advantages:
    """``credit: turn``: per-turn returns, baselined per turn position, spread over the turns'
    tokens (see ``trainer/credit.py`` for which tokens are whose). A harness episode's turns
    run on across its segments: the returns are the whole episode's, and each segment's turns
    get theirs on its own tokens (the KL in the reward is the last record's: the reference
    model scores that one)."""
    spans, returns = [], []
    for k, i in enumerate(scored.usable):
        t = scored.trajectories[i]
        spans.append(record_turn_spans(t))
        rewards = turn_rewards(t, float(scored.rewards[k]))
        if scored.kl_penalty is not None:
            earlier = sum(len(record) for record in spans[-1][:-1])
            kl = span_sums(spans[-1][-1], scored.kl_penalty[k])
            rewards = rewards - torch.cat([torch.zeros(earlier, dtype=kl.dtype), kl])
        returns.append(discounted_returns(rewards, algorithm.gamma))
    per_turn = per_turn_advantages(algorithm.advantage, returns, scored.groups)
    tokens, segment_tokens = [], []
    for records, values, i in zip(spans, per_turn, scored.usable, strict=True):
        t = scored.trajectories[i]
        lengths = [len(s.token_ids) for s in t.segments] + [len(t.token_ids or [])]
        parts = torch.split(values, [len(record) for record in records])
        laid = [spread(r, v, n) for r, v, n in zip(records, parts, lengths, strict=True)]
        tokens.append(laid[-1])
        segment_tokens.append(laid[:-1])
    first = torch.stack([a[0] for a in per_turn])
    return Advantages(first, tokens, torch.cat(per_turn), segment_tokens=segment_tokens)


# -- helpers ----------------------------------------------------------------------------------


def _trainable(t: Trajectory) -> bool:
    """Has a token record with policy tokens, and an outcome the loss learns from
    (:data:`~envhub.types.TRAINED_OUTCOMES`: ``ok`` or ``policy_failure``; env, infrastructure
    and timeout failures say nothing about the policy)."""
    has_tokens = t.token_ids is not None and t.loss_mask is not None and any(t.loss_mask)
    return t.outcome in TRAINED_OUTCOMES and has_tokens


def _sampled_tokens(t: Trajectory) -> int:
    return sum(t.loss_mask or []) + sum(sum(s.loss_mask) for s in t.segments)


def _group_index(group_ids: Sequence[str]) -> torch.Tensor:
    numbers: dict[str, int] = {}
    return torch.tensor([numbers.setdefault(g, len(numbers)) for g in group_ids], dtype=torch.long)


def _longest_turn(t: Trajectory) -> int:
    return max((turn.completion_tokens or 0 for turn in t.turns), default=0)
