"""From trajectories to training tensors: rewards -> advantages -> filter -> pack.

Advantages are one per sequence (``credit: episode``, broadcast over its tokens), one per turn
(``credit: turn``, each turn's on its own sampled tokens, see ``trainer/credit.py``) or one per
token (``advantage: gae``, from a critic's values, see ``trainer/critic/targets.py``); either
way a micro-batch carries them per target token, laid out like its ``loss_mask``.

The token record of each trajectory is used exactly as sampled (``token_ids``, ``loss_mask``,
``sampler_logprobs``); nothing is re-tokenised. Trajectories whose ``outcome`` is a failure
outside the policy's control (env, infrastructure, timeout) or that carry no token record are
kept out of the loss, and counted. Micro-batches are bins of whole sequences within a token budget
(first-fit decreasing), so that gradient accumulation over them equals one big batch (the loss
normalisers are whole-batch totals, see ``algorithms.aggregation``). A backend either runs a
bin right-padded (its budget counts padded tokens) or packed end to end into one row without
padding (its budget counts real tokens; :class:`Packing` says where each sequence sits).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate

import torch

from envhub.trainer.algorithms import (
    compute_advantages,
    discounted_returns,
    overlong_penalty,
    per_turn_advantages,
    zero_variance_groups,
)
from envhub.trainer.config import AlgorithmConfig
from envhub.trainer.credit import span_sums, spread, turn_rewards, turn_spans
from envhub.trainer.critic.targets import ValueTarget, gae_targets
from envhub.types import TRAINED_OUTCOMES, Trajectory


@dataclass
class Sample:
    """One trajectory ready for the loss."""

    token_ids: list[int]
    loss_mask: list[int]
    sampler_logprobs: list[float]
    advantage: float
    """The sequence's advantage (with ``credit: turn``: its first turn's)."""
    trajectory: int
    """Index of the trajectory in the step's rollouts."""
    token_advantages: list[float] | None = None
    """Each token's advantage, aligned with ``token_ids`` (0.0 off the turns), when they differ
    within the sequence (``credit: turn``, ``advantage: gae``); ``None``: ``advantage`` on every
    token."""
    value_target: ValueTarget | None = None
    """With a critic: what it learns on this sequence (``advantage: gae``)."""

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def has_signal(self) -> bool:
        """Some token in the loss has a non-zero advantage."""
        if self.token_advantages is None:
            return self.advantage != 0.0
        pairs = zip(self.token_advantages, self.loss_mask, strict=True)
        return any(a != 0.0 and m for a, m in pairs)


@dataclass
class MicroBatch:
    """Right-padded tensors of a few samples. Per-token fields are aligned with the *targets*:
    position ``t`` holds the logprob/mask of ``input_ids[:, t + 1]``."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    sampler_logprobs: torch.Tensor
    advantages: torch.Tensor
    """``[n, width - 1]`` the advantage of each target token (0 on padding), like ``loss_mask``."""
    samples: list[int]
    """Indices into the batch's samples."""

    @property
    def num_tokens(self) -> int:
        """Target tokens in the loss (the sum of ``loss_mask``)."""
        return int(self.loss_mask.sum().item())

    def to(self, device: torch.device | str) -> MicroBatch:
        """A copy with every tensor on ``device`` (``samples`` is shared, not copied)."""
        moved = {
            name: getattr(self, name).to(device)
            for name in (
                "input_ids",
                "attention_mask",
                "loss_mask",
                "sampler_logprobs",
                "advantages",
            )
        }
        return MicroBatch(**moved, samples=self.samples)


@dataclass
class Batch:
    """A step's training data and what was filtered out on the way."""

    samples: list[Sample]
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        """Policy tokens in the loss (the ``token-mean`` normaliser)."""
        return sum(sum(s.loss_mask[1:]) for s in self.samples)

    @property
    def num_sequences(self) -> int:
        """Sequences in the loss (the normaliser of the ``seq-mean-*`` aggregations)."""
        return len(self.samples)


def build_batch(
    trajectories: Sequence[Trajectory], algorithm: AlgorithmConfig, max_tokens: int
) -> Batch:
    """The step's samples: :func:`score`, then :func:`estimate_advantages`, then :func:`select`.

    Args:
        trajectories: The step's rollouts (groups share ``group_id``).
        algorithm: Advantage estimator, dynamic sampling and overlong handling.
        max_tokens: The per-turn token budget (for the overlong penalty).
    """
    scored = score(trajectories, algorithm, max_tokens)
    return select(scored, estimate_advantages(scored, algorithm), algorithm)


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
        """``(len(usable),)`` tokens the policy sampled in each usable trajectory."""
        counts = [sum(self.trajectories[i].loss_mask or []) for i in self.usable]
        return torch.tensor(counts, dtype=torch.float64)


def score(
    trajectories: Sequence[Trajectory], algorithm: AlgorithmConfig, max_tokens: int
) -> Scored:
    """Rewards of the usable trajectories and their groups.

    Args:
        trajectories: The step's rollouts (groups share ``group_id``).
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
    groups = _group_index([trajectories[i].group_id for i in usable])
    return Scored(trajectories, usable, rewards, groups)


def has_signal(group: Sequence[Trajectory], algorithm: AlgorithmConfig, max_tokens: int) -> bool:
    """Whether dynamic sampling would keep this one group: its usable rewards (shaped as
    :func:`score` shapes them) are not all equal."""
    scored = score(group, algorithm, max_tokens)
    return bool(scored.usable) and bool(zero_variance_groups(scored.rewards, scored.groups).all())


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

    def abs_mean(self) -> float:
        """Mean absolute advantage, over sequences (or over turns, with ``credit: turn``)."""
        values = self.sequence if self.turns is None else self.turns
        return float(values.abs().mean()) if values.numel() else 0.0


def estimate_advantages(
    scored: Scored, algorithm: AlgorithmConfig, values: Sequence[torch.Tensor] | None = None
) -> Advantages:
    """Advantages by ``algorithm.advantage``, per group, of the usable trajectories.

    With ``credit: episode`` (the default) one per sequence from its episode reward; with
    ``credit: turn`` one per turn from the discounted return from that turn on (``gamma``), the
    estimator applied per turn position (``algorithm.returns.per_turn_advantages``). With KL in
    the reward, the KL penalty of a sequence's (or a turn's) tokens is taken off its reward.
    ``gae`` estimates one per token from the critic's ``values`` (``critic/targets.py``).

    Args:
        scored: The step's rewards and groups (:func:`score`).
        algorithm: Names the estimator and the credit.
        values: ``advantage: gae`` only: the critic's ``(L - 1,)`` values of each usable
            trajectory.
    """
    if not scored.usable:
        return Advantages(torch.zeros(0, dtype=torch.float64))
    if algorithm.advantage == "gae":
        return _gae_advantages(scored, algorithm, values)
    if algorithm.credit == "turn":
        return _turn_advantages(scored, algorithm)
    rewards = scored.rewards
    if scored.kl_penalty is not None:
        rewards = rewards - torch.stack([p.sum() for p in scored.kl_penalty])
    options: dict[str, torch.Tensor] = {}
    if algorithm.advantage == "opo":
        options["lengths"] = scored.lengths()
    if algorithm.advantage == "remax":
        options["baselines"] = scored.baselines()
    return Advantages(compute_advantages(algorithm.advantage, rewards, scored.groups, **options))


def _gae_advantages(
    scored: Scored, algorithm: AlgorithmConfig, values: Sequence[torch.Tensor] | None
) -> Advantages:
    """``advantage: gae``: per-token advantages and the critic's targets (``critic/targets``)."""
    if values is None or len(values) != len(scored.usable):
        raise ValueError("advantage gae needs the critic's values of every usable trajectory")
    result = gae_targets(
        [scored.trajectories[i] for i in scored.usable],
        scored.rewards,
        values,
        algorithm,
        scored.kl_penalty,
    )
    first = torch.tensor(
        [_first_policy_value(a, scored.trajectories[i]) for a, i in zip(
            result.token_advantages, scored.usable, strict=True
        )],
        dtype=torch.float64,
    )  # fmt: skip
    return Advantages(first, result.token_advantages, result.policy_tokens, result.value_targets)


def _first_policy_value(per_token: list[float], t: Trajectory) -> float:
    """The advantage of the first token the policy sampled."""
    mask = t.loss_mask or []
    return next((a for a, m in zip(per_token, mask, strict=True) if m), 0.0)


def _turn_advantages(scored: Scored, algorithm: AlgorithmConfig) -> Advantages:
    """``credit: turn``: per-turn returns, baselined per turn position, spread over the turns'
    tokens (see ``trainer/credit.py`` for which tokens are whose)."""
    spans, returns = [], []
    for k, i in enumerate(scored.usable):
        t = scored.trajectories[i]
        spans.append(turn_spans(t))
        rewards = turn_rewards(t, float(scored.rewards[k]))
        if scored.kl_penalty is not None:
            rewards = rewards - span_sums(spans[-1], scored.kl_penalty[k])
        returns.append(discounted_returns(rewards, algorithm.gamma))
    per_turn = per_turn_advantages(algorithm.advantage, returns, scored.groups)
    tokens = [
        spread(s, a, len(scored.trajectories[i].token_ids or []))
        for s, a, i in zip(spans, per_turn, scored.usable, strict=True)
    ]
    first = torch.stack([a[0] for a in per_turn])
    return Advantages(first, tokens, torch.cat(per_turn))


def select(scored: Scored, advantages: Advantages, algorithm: AlgorithmConfig) -> Batch:
    """The samples that stay in the loss, with ``batch/*`` stats of what was dropped.

    Dynamic sampling drops the groups whose rewards are all equal; the overlong filter drops
    trajectories cut at the length limit. Both only when ``algorithm`` asks for them.

    Args:
        scored: The step's rewards and groups (:func:`score`).
        advantages: One per usable trajectory (:func:`estimate_advantages`).
        algorithm: ``dynamic_sampling`` and ``overlong.filter``.
    """
    trajectories, usable = scored.trajectories, scored.usable
    rewards, groups = scored.rewards, scored.groups
    stats = {
        "batch/trajectories": float(len(trajectories)),
        "batch/unusable": float(len(trajectories) - len(usable)),
    }
    if not usable:
        return Batch([], stats | _empty_stats())
    keep = torch.ones(len(usable), dtype=torch.bool)
    if algorithm.dynamic_sampling:
        keep &= zero_variance_groups(rewards, groups)
    if algorithm.overlong.filter:
        keep &= torch.tensor([not _hit_length(trajectories[i]) for i in usable])
    tokens, targets = advantages.tokens, advantages.value_targets
    samples = [
        _sample(
            trajectories[i],
            float(advantages.sequence[k]),
            i,
            tokens[k] if tokens else None,
            targets[k] if targets else None,
        )
        for k, i in enumerate(usable)
        if keep[k]
    ]
    stats |= {
        "batch/kept": float(len(samples)),
        "batch/zero_variance_groups": float(_dropped_groups(rewards, groups))
        if algorithm.dynamic_sampling
        else 0.0,
        "batch/advantage_abs_mean": advantages.abs_mean(),
    }
    return Batch(samples, stats)


@dataclass(frozen=True)
class NoSignal:
    """Why a step had nothing to learn from."""

    reason: str
    solved: bool
    """Every usable episode passed: the policy solves what it drew (nothing is broken)."""


def no_signal(scored: Scored, batch: Batch, pass_threshold: float) -> NoSignal | None:
    """Why the step has nothing to learn from (no sample kept, or every kept advantage zero),
    in words a user can act on; ``None`` when it has something."""
    if any(s.has_signal for s in batch.samples):
        return None
    trajectories = scored.trajectories
    solved = bool(scored.usable) and bool((scored.rewards >= pass_threshold).all())
    if not trajectories:
        reason = "the step rolled out no episodes"
    elif not scored.usable:
        reason = f"none of the {len(trajectories)} episodes is trainable (failed, or no tokens)"
    elif zero_variance_groups(scored.rewards, scored.groups).any():
        reason = "the overlong filter dropped every group with signal (all hit the length limit)"
    else:
        reason = f"every group's rewards are tied ({_tied_at(scored)}), so every advantage is 0"
    error = next((e for t in trajectories for e in t.errors), None)
    if error is not None:
        reason += f"; first recorded error: {error.stage}: {error.type}: {error.message}"
    return NoSignal(reason, solved)


def _tied_at(scored: Scored) -> str:
    """``"3 groups at 0, 1 group at 1"``: where the groups' tied rewards lie."""
    counts: dict[float, int] = {}
    for group in torch.unique(scored.groups).tolist():
        reward = round(float(scored.rewards[scored.groups == group][0]), 6)
        counts[reward] = counts.get(reward, 0) + 1
    return ", ".join(f"{n} group{'s' if n > 1 else ''} at {r:g}" for r, n in sorted(counts.items()))


def pack(lengths: Sequence[int], budget: int, *, padded: bool = True) -> list[list[int]]:
    """Group sequence indices into bins that fit ``budget`` tokens: counted padded (count x
    longest) or, with ``padded=False``, packed end to end (the sum of the lengths).

    First-fit decreasing: longest sequences first, each into the first bin where it fits. A
    sequence longer than the budget gets a bin of its own (it cannot be split).
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    for i in order:
        for b in bins:
            if _size(b, lengths, i, padded) <= budget:
                b.append(i)
                break
        else:
            bins.append([i])
    return bins


def _size(bin_: list[int], lengths: Sequence[int], extra: int, padded: bool) -> int:
    """Tokens of ``bin_`` with sequence ``extra`` added."""
    if padded:  # the bin is sorted by length: its first sequence is the longest
        return (len(bin_) + 1) * max(lengths[bin_[0]], lengths[extra])
    return sum(lengths[j] for j in bin_) + lengths[extra]


def micro_batches(
    batch: Batch, budget: int, pad_id: int, *, packed: bool = False
) -> list[MicroBatch]:
    """The batch as micro-batches of at most ``budget`` tokens each (padded, or packed: see
    :func:`pack`). The tensors are right-padded either way; a packing backend lays each one
    out with :class:`Packing`."""
    bins = pack([len(s) for s in batch.samples], budget, padded=not packed)
    return [collate([batch.samples[i] for i in b], b, pad_id) for b in bins]


def bin_of_sequence(bins: Sequence[Sequence[int]]) -> dict[int, int]:
    """Sequence index -> the index of its bin (micro-batch)."""
    return {i: k for k, b in enumerate(bins) for i in b}


@dataclass(frozen=True)
class Packing:
    """A micro-batch's sequences laid end to end in one row, without padding between them.

    Sequence ``i`` fills ``[starts[i], starts[i] + lengths[i])`` of the row. The row is padded
    at its end to a multiple of ``multiple`` (a tensor-parallel sequence split needs that); the
    padding is one more segment that attends only to itself and is never scored. Each segment
    attends causally within itself only, and positions restart at 0 in each.
    """

    lengths: tuple[int, ...]
    multiple: int = 1

    @classmethod
    def of(cls, mb: MicroBatch, multiple: int = 1) -> Packing:
        """The packing of ``mb``'s sequences, their lengths read from its attention mask."""
        return cls(tuple(int(n) for n in mb.attention_mask.sum(1).tolist()), multiple)

    @property
    def starts(self) -> list[int]:
        """Where each sequence begins in the row (the running sum of the lengths before it)."""
        return [0, *accumulate(self.lengths)][:-1]

    @property
    def total(self) -> int:
        """The row's length, padding included."""
        used = sum(self.lengths)
        return -(-used // self.multiple) * self.multiple

    @property
    def segments(self) -> list[int]:
        """Lengths of the row's segments: the sequences, then the end padding if any."""
        pad = self.total - sum(self.lengths)
        return [*self.lengths, pad] if pad else list(self.lengths)

    def cu_seqlens(self) -> torch.Tensor:
        """Segment boundaries (``[0, end_0, end_1, ...]``, int32), as varlen attention takes
        them."""
        return torch.tensor([0, *accumulate(self.segments)], dtype=torch.int32)

    def row(self, input_ids: torch.Tensor, pad_id: int = 0) -> torch.Tensor:
        """The right-padded ``[n, width]`` ids as one packed ``[1, total]`` row."""
        row = torch.full((1, self.total), pad_id, dtype=input_ids.dtype)
        for i, (start, length) in enumerate(zip(self.starts, self.lengths, strict=True)):
            row[0, start : start + length] = input_ids[i, :length]
        return row

    def positions(self) -> torch.Tensor:
        """``[1, total]`` position ids restarting at 0 in every segment."""
        return torch.cat([torch.arange(n) for n in self.segments]).unsqueeze(0)

    def blocked(self) -> torch.Tensor:
        """``[1, 1, total, total]`` attention mask, ``True`` where a query may not look (a later
        position or another segment): Megatron's convention."""
        segment = torch.repeat_interleave(
            torch.arange(len(self.segments)), torch.tensor(self.segments)
        )
        causal = torch.ones(self.total, self.total, dtype=torch.bool).tril()
        allowed = causal & (segment[:, None] == segment[None, :])
        return (~allowed)[None, None]

    def unpack(self, values: torch.Tensor, width: int) -> torch.Tensor:
        """Per-target values of the packed row (``[..., total - 1]``: position ``t`` scores token
        ``t + 1``) back to the right-padded ``[n, width - 1]`` layout of ``MicroBatch.loss_mask``.
        Targets across a boundary are dropped; padded places are 0. Differentiable."""
        flat = values.reshape(-1)
        column = torch.arange(width - 1, device=flat.device)
        starts = torch.tensor(self.starts, device=flat.device)[:, None]
        valid = column[None, :] < (torch.tensor(self.lengths, device=flat.device)[:, None] - 1)
        index = torch.where(valid, starts + column[None, :], 0)
        return torch.where(valid, flat[index], flat.new_zeros(()))


def collate(samples: Sequence[Sample], indices: list[int], pad_id: int) -> MicroBatch:
    """Right-pad ``samples`` into one micro-batch (targets shifted by one position)."""
    width = max(len(s) for s in samples)
    n = len(samples)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width - 1), dtype=torch.float32)
    sampler = torch.zeros((n, width - 1), dtype=torch.float32)
    advantages = torch.zeros((n, width - 1), dtype=torch.float32)
    for row, s in enumerate(samples):
        length = len(s)
        input_ids[row, :length] = torch.tensor(s.token_ids)
        attention[row, :length] = 1
        mask[row, : length - 1] = torch.tensor(s.loss_mask[1:], dtype=torch.float32)
        sampler[row, : length - 1] = torch.tensor(s.sampler_logprobs[1:], dtype=torch.float32)
        if s.token_advantages is None:  # the same float32 value on every target
            advantages[row, : length - 1] = s.advantage
        else:
            advantages[row, : length - 1] = torch.tensor(
                s.token_advantages[1:], dtype=torch.float32
            )
    return MicroBatch(input_ids, attention, mask, sampler, advantages, list(indices))


# -- helpers ----------------------------------------------------------------------------------


def _trainable(t: Trajectory) -> bool:
    """Has a token record with policy tokens, and an outcome the loss learns from
    (:data:`~envhub.types.TRAINED_OUTCOMES`: ``ok`` or ``policy_failure``; env, infrastructure
    and timeout failures say nothing about the policy)."""
    has_tokens = t.token_ids is not None and t.loss_mask is not None and any(t.loss_mask)
    return t.outcome in TRAINED_OUTCOMES and has_tokens


def _sample(
    t: Trajectory,
    advantage: float,
    index: int,
    token_advantages: list[float] | None,
    value_target: ValueTarget | None = None,
) -> Sample:
    assert t.token_ids is not None and t.loss_mask is not None
    logprobs = t.sampler_logprobs if t.sampler_logprobs is not None else [0.0] * len(t.token_ids)
    return Sample(
        list(t.token_ids),
        list(t.loss_mask),
        list(logprobs),
        advantage,
        index,
        token_advantages,
        value_target,
    )


def _group_index(group_ids: Sequence[str]) -> torch.Tensor:
    numbers: dict[str, int] = {}
    return torch.tensor([numbers.setdefault(g, len(numbers)) for g in group_ids], dtype=torch.long)


def _dropped_groups(rewards: torch.Tensor, groups: torch.Tensor) -> int:
    keep = zero_variance_groups(rewards, groups)
    return len(set(groups[~keep].tolist()))


def _longest_turn(t: Trajectory) -> int:
    return max((turn.completion_tokens or 0 for turn in t.turns), default=0)


def _hit_length(t: Trajectory) -> bool:
    return any(turn.finish_reason == "length" for turn in t.turns) or t.stop_reason == "max_tokens"


def _empty_stats() -> dict[str, float]:
    return {"batch/kept": 0.0, "batch/zero_variance_groups": 0.0, "batch/advantage_abs_mean": 0.0}
