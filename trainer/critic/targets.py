"""GAE on the step's trajectories: per-token advantages for the policy, returns for the critic.

Everything is laid out like a micro-batch's targets: place ``t`` of a sequence of ``L`` tokens
is the state after tokens ``0..t``, from which the policy sampled token ``t + 1``; the critic's
value there is ``V_t``. Two ways to cut an episode into steps (``algorithm.gae_unit``):

- ``token`` (verl's PPO): every sampled token is a step. A turn's reward (``credit: turn``: its
  step reward; ``credit: episode``: the episode's, on the last turn) lands on the turn's last
  token, the KL-in-reward penalty on each token; tool replies and the template between turns
  are no steps of the policy, so GAE passes over them. The critic learns the return at every
  sampled token.
- ``turn``: every assistant turn is a step, valued at the place before its first token; GAE
  runs over the turns (``credit: turn``'s per-turn rewards) and a turn's advantage goes on all
  of its tokens. The critic learns the return at each turn's first place only.

Advantages are then whitened over the batch's policy tokens unless
``algorithm.whiten_advantages`` is off. ``gamma = lam = 1`` with one reward at the end makes
every token's advantage ``R - V_t``: REINFORCE with a learned baseline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from envhub.trainer.algorithms import gae, masked_whiten
from envhub.trainer.config import AlgorithmConfig
from envhub.trainer.credit import span_sums, spread, turn_rewards, turn_spans
from envhub.types import Trajectory


@dataclass(frozen=True)
class ValueTarget:
    """What the critic learns on one sequence, laid out like its targets (``L - 1`` places)."""

    old_values: Tensor
    """The critic's values when the step's advantages were estimated."""
    returns: Tensor
    """GAE's returns (advantage + old value): what the values should become."""
    mask: Tensor
    """``bool``: the places the critic learns on (sampled tokens, or turns' first places)."""


@dataclass(frozen=True)
class GAEResult:
    """GAE over the usable trajectories of a step, one entry per trajectory."""

    token_advantages: list[list[float]]
    """Aligned with each trajectory's ``token_ids`` (0.0 where the policy did not sample)."""
    value_targets: list[ValueTarget]
    policy_tokens: Tensor
    """Every sampled token's advantage, flat (for the step's metrics)."""


def gae_targets(
    trajectories: Sequence[Trajectory],
    rewards: Tensor,
    values: Sequence[Tensor],
    algorithm: AlgorithmConfig,
    kl_penalty: Sequence[Tensor] | None = None,
) -> GAEResult:
    """Advantages and critic targets by GAE (see the module docstring).

    Args:
        trajectories: The usable trajectories (each with a token record).
        rewards: ``(N,)`` their episode rewards, shaping included (``Scored.rewards``).
        values: Per trajectory, the critic's ``(L - 1,)`` values.
        algorithm: ``gamma``, ``lam``, ``gae_unit``, ``credit``, ``whiten_advantages``.
        kl_penalty: Per trajectory, ``coef * KL`` of each token (aligned with ``token_ids``), to
            take off the rewards; ``None`` without KL in the reward.
    """
    per_token, targets, masks = [], [], []
    for k, t in enumerate(trajectories):
        penalty = kl_penalty[k] if kl_penalty is not None else None
        step = _by_turn if algorithm.gae_unit == "turn" else _by_token
        advantages, target = step(t, float(rewards[k]), values[k].double(), algorithm, penalty)
        per_token.append(advantages)
        targets.append(target)
        masks.append(_policy_places(t))
    if algorithm.whiten_advantages:
        per_token = _whiten_together(per_token, masks)
    flat = torch.cat([a[m] for a, m in zip(per_token, masks, strict=True)]) if per_token else None
    return GAEResult(
        [[0.0, *a.tolist()] for a in per_token],
        targets,
        flat if flat is not None else torch.zeros(0, dtype=torch.float64),
    )


def _policy_places(t: Trajectory) -> Tensor:
    """``(L - 1,)`` bool: the places whose next token the policy sampled."""
    assert t.loss_mask is not None
    return torch.tensor(t.loss_mask[1:], dtype=torch.bool)


def _step_rewards(t: Trajectory, episode_reward: float, algorithm: AlgorithmConfig) -> Tensor:
    """``(turns,)`` rewards: each turn's (``credit: turn``), or all on the last turn."""
    if algorithm.credit == "turn":
        return turn_rewards(t, episode_reward)
    rewards = torch.zeros(max(len(t.turns), 1), dtype=torch.float64)
    rewards[-1] = episode_reward
    return rewards


def _by_token(
    t: Trajectory,
    episode_reward: float,
    values: Tensor,
    algorithm: AlgorithmConfig,
    kl_penalty: Tensor | None,
) -> tuple[Tensor, ValueTarget]:
    """GAE with every sampled token a step; rewards on each turn's last token (``credit:
    episode``: the episode's on the last sampled token, without reading the turn records)."""
    mask = _policy_places(t)
    rewards = torch.zeros_like(values)
    if algorithm.credit == "turn":
        places = _reward_places(turn_spans(t))
        for place, reward in zip(places, turn_rewards(t, episode_reward).tolist(), strict=True):
            rewards[place] += reward
    else:
        rewards[int(mask.nonzero().max())] = episode_reward
    if kl_penalty is not None:
        rewards = rewards - kl_penalty[1:].double()
    advantages, returns = gae(rewards, values, algorithm.gamma, algorithm.lam, mask)
    return advantages, ValueTarget(values, returns, mask)


def _reward_places(spans: list[tuple[int, int]]) -> list[int]:
    """The target place of each turn's last token (a turn that sampled nothing: the nearest
    earlier sampled token's, else the first sampled token's)."""
    places, last = [], None
    for start, end in spans:
        if end > start:
            last = end - 2  # token end - 1 is scored at place end - 2
        places.append(last)
    first = next((p for p in places if p is not None), 0)
    return [first if p is None else p for p in places]


def _by_turn(
    t: Trajectory,
    episode_reward: float,
    values: Tensor,
    algorithm: AlgorithmConfig,
    kl_penalty: Tensor | None,
) -> tuple[Tensor, ValueTarget]:
    """GAE with every turn a step, valued at the place before its first token."""
    spans = turn_spans(t)
    rewards = _step_rewards(t, episode_reward, algorithm)
    if kl_penalty is not None:
        rewards = rewards - span_sums(spans, kl_penalty.double())
    sampled = torch.tensor([end > start for start, end in spans], dtype=torch.bool)
    first = torch.tensor([max(start - 1, 0) for start, _ in spans])
    advantages, returns = gae(rewards, values[first], algorithm.gamma, algorithm.lam, sampled)
    mask = torch.zeros_like(values, dtype=torch.bool)
    mask[first[sampled]] = True
    turn_returns = torch.zeros_like(values)
    turn_returns[first[sampled]] = returns[sampled]
    per_token = torch.tensor(spread(spans, advantages, len(values) + 1)[1:], dtype=torch.float64)
    return per_token, ValueTarget(values, turn_returns, mask)


def _whiten_together(advantages: list[Tensor], masks: list[Tensor]) -> list[Tensor]:
    """Whiten every sequence's advantages with the mean and std of all policy tokens."""
    if not advantages:
        return advantages
    lengths = [len(a) for a in advantages]
    flat = masked_whiten(torch.cat(advantages), torch.cat(masks))
    return list(torch.split(flat, lengths))


def stack_targets(
    targets: Sequence[ValueTarget | None], width: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Old values, returns and mask of a micro-batch's sequences, right-padded to ``width``
    places (float32, float32, bool): laid out like its ``loss_mask``."""
    old = torch.zeros((len(targets), width), dtype=torch.float32)
    returns = torch.zeros_like(old)
    mask = torch.zeros_like(old, dtype=torch.bool)
    for row, t in enumerate(targets):
        if t is None:
            raise ValueError("every sample the critic learns from needs a value_target")
        n = len(t.mask)
        old[row, :n], returns[row, :n], mask[row, :n] = t.old_values, t.returns, t.mask
    return old, returns, mask


def value_places(samples: Sequence[Any]) -> int:
    """How many places the critic learns on in ``samples`` (their value targets' masks): the
    value loss's normaliser for the whole update."""
    if any(s.value_target is None for s in samples):
        raise ValueError("every sample the critic learns from needs a value_target")
    return sum(int(s.value_target.mask.sum()) for s in samples)
