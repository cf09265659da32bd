"""From scored trajectories to training tensors: filter -> pack.

The rewards, groups and advantages come from ``trainer/scoring.py``; a micro-batch carries the
advantages per target token, laid out like its ``loss_mask``.

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

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate

import torch

from envhub.trainer.algorithms import zero_variance_groups
from envhub.trainer.config import AlgorithmConfig
from envhub.trainer.critic.targets import ValueTarget
from envhub.trainer.role_balance import balance_roles
from envhub.trainer.sample import Sample
from envhub.trainer.scoring import (
    Advantages,
    Scored,
    estimate_advantages,
    first_sampled,
    score,
)
from envhub.types import TokenSegment, Trajectory


def to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``tensor`` on ``device``; from the host without making the host wait for the device
    (a blocking copy to a GPU synchronises the stream: an H200 profile counted ~21 stream syncs
    per Megatron micro-batch, about half of them such copies, and 5 per torch-backend one). Safe
    because the copy is ordered on the device's stream and the driver stages a pageable source
    before returning; a copy *to* the host stays blocking, since the host reads it next."""
    return tensor.to(device, non_blocking=tensor.device.type == "cpu")


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
    supervised: torch.Tensor | None = None
    """``[n, width - 1]`` each target's cross-entropy weight where it is a demonstration's
    (``Sample.supervised``), 0 elsewhere; ``None`` when no sample of the micro-batch is one."""

    @property
    def num_tokens(self) -> int:
        """Target tokens in the loss (the sum of ``loss_mask``)."""
        return int(self.loss_mask.sum().item())

    def to(self, device: torch.device | str) -> MicroBatch:
        """A copy with every tensor on ``device`` (``samples`` is shared, not copied), moved
        by :func:`to_device`."""
        moved = {
            name: to_device(getattr(self, name), device)
            for name in (
                "input_ids",
                "attention_mask",
                "loss_mask",
                "sampler_logprobs",
                "advantages",
            )
        }
        supervised = None if self.supervised is None else to_device(self.supervised, device)
        return MicroBatch(**moved, samples=self.samples, supervised=supervised)


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
        trajectories: The step's rollouts (groups share ``group_key``).
        algorithm: Advantage estimator, dynamic sampling and overlong handling.
        max_tokens: The per-turn token budget (for the overlong penalty).
    """
    scored = score(trajectories, algorithm, max_tokens)
    return select(scored, estimate_advantages(scored, algorithm), algorithm)


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
    samples, skipped_segments = [], 0
    for k, i in enumerate(usable):
        if not keep[k]:
            continue
        t, advantage = trajectories[i], float(advantages.sequence[k])
        token_advantages = tokens[k] if tokens else None
        target = targets[k] if targets else None
        samples.append(_sample(t, advantage, i, token_advantages, target))
        # A harness episode's earlier segments train with the episode's advantage, or with
        # turn credit their turns' own; a critic's values cover the last record only, so with
        # one the earlier segments are left out and counted.
        if target is not None:
            skipped_segments += len(t.segments)
        elif advantages.segment_tokens is not None:
            laid = advantages.segment_tokens[k]
            samples.extend(
                _segment_sample(segment, first_sampled(per_token, segment.loss_mask), i, per_token)
                for segment, per_token in zip(t.segments, laid, strict=True)
            )
        else:
            samples.extend(_segment_sample(segment, advantage, i) for segment in t.segments)
    if algorithm.role_balance or algorithm.role_scale:
        samples, role_stats = balance_roles(
            samples,
            trajectories,
            algorithm.aggregation,
            balance=algorithm.role_balance,
            scale=algorithm.role_scale,
        )
        stats |= role_stats
    stats |= {
        "batch/kept": float(len(samples)),
        "batch/segments_skipped": float(skipped_segments),
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
    hint: str = ""
    """What to do about it, when the reason suggests something (``""``: nothing to add)."""


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
    never = bool(scored.usable) and not bool((scored.rewards >= pass_threshold).any())
    return NoSignal(reason, solved, COLD_START if never and error is None else "")


COLD_START = (
    "no episode passed, so RL has nothing to reinforce: show the model how first, with a warm "
    "start on demonstrations (sft: the env's reference policy, recorded episodes) or a "
    "teacher (distill:); docs: 'When RL has nothing to learn from'"
)
"""The hint of a step in which no episode passed (the cold start)."""


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
    batch: Batch,
    budget: int,
    pad_id: int,
    *,
    packed: bool = False,
    shared_prompts: bool = False,
) -> list[MicroBatch]:
    """The batch as micro-batches of at most ``budget`` tokens each (padded, or packed: see
    :func:`pack`; packed with ``shared_prompts``: see :func:`pack_sharing_prompts`). The tensors
    are right-padded either way; a packing backend lays each one out as its row."""
    if shared_prompts:
        bins = pack_sharing_prompts(batch.samples, budget)
    else:
        bins = pack([len(s) for s in batch.samples], budget, padded=not packed)
    return [collate([batch.samples[i] for i in b], b, pad_id) for b in bins]


def pack_sharing_prompts(samples: Sequence[Sample], budget: int) -> list[list[int]]:
    """Bins of sequence indices for rows where sequences with the same prompt (the tokens before
    the first trained one) run it once: a bin costs each of its prompts once plus every
    sequence's rest. The samples of a prompt stay together, in as few bins as the budget allows
    (longest first); these groups and the lone sequences then go first-fit decreasing."""
    groups = prompt_groups([s.token_ids for s in samples], [s.loss_mask for s in samples])
    items: list[tuple[int, list[int]]] = []  # (tokens, indices)
    for shared, members in groups:
        chunk: list[int] = []
        used = shared
        for i in sorted(members, key=lambda j: (-len(samples[j]), j)):
            rest = len(samples[i]) - shared
            if chunk and used + rest > budget:
                items.append((used, chunk))
                chunk, used = [], shared
            chunk.append(i)
            used += rest
        items.append((used, chunk))
    bins: list[tuple[int, list[int]]] = []
    for tokens, indices in sorted(items, key=lambda item: (-item[0], item[1][0])):
        for k, (filled, held) in enumerate(bins):
            if filled + tokens <= budget:
                bins[k] = (filled + tokens, held + indices)
                break
        else:
            bins.append((tokens, list(indices)))
    return [held for _, held in bins]


def prompt_length(sample: Sample) -> int:
    """Tokens before the sample's first trained token (its whole length when none is): what
    sequences with the same start can share in a packed row."""
    return _first_trained(sample.loss_mask, len(sample))


def prompt_groups(
    token_ids: Sequence[Sequence[int]], loss_masks: Sequence[Sequence[int]]
) -> list[tuple[int, list[int]]]:
    """Sequences grouped by their prompt (the tokens before their first trained one; masks
    aligned with the tokens), in order of first appearance: ``(shared prompt length,
    indices)``, the length 0 for a sequence alone or one with nothing trained."""
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for i, (ids, mask) in enumerate(zip(token_ids, loss_masks, strict=True)):
        p = _first_trained(mask, len(ids))
        key = tuple(ids[:p]) if p < len(ids) else (-1 - i,)
        by_prompt.setdefault(key, []).append(i)
    return [(len(key) if len(rows) > 1 else 0, rows) for key, rows in by_prompt.items()]


def _first_trained(mask: Sequence[int], length: int) -> int:
    """The index of the first trained token after the first (``length`` when none is)."""
    return next((t for t in range(1, length) if mask[t]), length)


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
        # Built on the host and moved without blocking: a tensor made from a Python list on a
        # GPU waits for the device (4 syncs per Megatron micro-batch in an H200 trace).
        column = torch.arange(width - 1)
        valid = column[None, :] < (torch.tensor(self.lengths)[:, None] - 1)
        index = torch.where(valid, torch.tensor(self.starts)[:, None] + column[None, :], 0)
        valid, index = to_device(valid, flat.device), to_device(index, flat.device)
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
    supervised = (
        torch.zeros((n, width - 1), dtype=torch.float32)
        if any(s.supervised for s in samples)
        else None
    )
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
        if supervised is not None and s.supervised:
            supervised[row, : length - 1] = mask[row, : length - 1] * s.supervised
    return MicroBatch(
        input_ids, attention, mask, sampler, advantages, list(indices), supervised=supervised
    )


# -- helpers ----------------------------------------------------------------------------------


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


def _segment_sample(
    segment: TokenSegment,
    advantage: float,
    index: int,
    token_advantages: list[float] | None = None,
) -> Sample:
    return Sample(
        list(segment.token_ids),
        list(segment.loss_mask),
        list(segment.sampler_logprobs),
        advantage,
        index,
        token_advantages,
    )


def _dropped_groups(rewards: torch.Tensor, groups: torch.Tensor) -> int:
    keep = zero_variance_groups(rewards, groups)
    return len(set(groups[~keep].tolist()))


def _hit_length(t: Trajectory) -> bool:
    return any(turn.finish_reason == "length" for turn in t.turns) or t.stop_reason == "max_tokens"


def _empty_stats() -> dict[str, float]:
    return {
        "batch/kept": 0.0,
        "batch/segments_skipped": 0.0,
        "batch/zero_variance_groups": 0.0,
        "batch/advantage_abs_mean": 0.0,
    }
