"""From trajectories to training tensors: rewards -> advantages -> filter -> pack.

The token record of each trajectory is used exactly as sampled (``token_ids``, ``loss_mask``,
``sampler_logprobs``); nothing is re-tokenised. Trajectories that failed outside the policy's
control (an env or engine error, recorded in ``errors``) or that carry no token record are kept
out of the loss, and counted. Micro-batches are bins of whole sequences, right-padded, whose
padded size stays within a token budget (first-fit decreasing), so that gradient accumulation
over them equals one big batch (the loss normalisers are whole-batch totals, see
``algorithms.aggregation``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from envhub.trainer.algorithms import compute_advantages, overlong_penalty, zero_variance_groups
from envhub.trainer.config import AlgorithmConfig
from envhub.types import Trajectory


@dataclass
class Sample:
    """One trajectory ready for the loss."""

    token_ids: list[int]
    loss_mask: list[int]
    sampler_logprobs: list[float]
    advantage: float
    trajectory: int
    """Index of the trajectory in the step's rollouts."""

    def __len__(self) -> int:
        return len(self.token_ids)


@dataclass
class MicroBatch:
    """Right-padded tensors of a few samples. Per-token fields are aligned with the *targets*:
    position ``t`` holds the logprob/mask of ``input_ids[:, t + 1]``."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    sampler_logprobs: torch.Tensor
    advantages: torch.Tensor
    samples: list[int]
    """Indices into the batch's samples."""

    @property
    def num_tokens(self) -> int:
        return int(self.loss_mask.sum().item())

    def to(self, device: torch.device | str) -> MicroBatch:
        moved = {name: getattr(self, name).to(device) for name in ("input_ids", "attention_mask", "loss_mask", "sampler_logprobs", "advantages")}
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
        return len(self.samples)


def build_batch(trajectories: Sequence[Trajectory], algorithm: AlgorithmConfig, max_tokens: int) -> Batch:
    """Score, compute advantages per group, filter and return the step's samples.

    Args:
        trajectories: The step's rollouts (groups share ``group_id``).
        algorithm: Advantage estimator, dynamic sampling and overlong handling.
        max_tokens: The per-turn token budget (for the overlong penalty).
    """
    usable = [i for i, t in enumerate(trajectories) if _trainable(t)]
    stats = {"batch/trajectories": float(len(trajectories)), "batch/unusable": float(len(trajectories) - len(usable))}
    if not usable:
        return Batch([], stats | _empty_stats())
    rewards = torch.tensor([trajectories[i].reward for i in usable], dtype=torch.float64)
    buffer = algorithm.overlong.soft_penalty_buffer
    if buffer is not None:
        longest_turn = torch.tensor([_longest_turn(trajectories[i]) for i in usable], dtype=torch.float64)
        rewards = rewards + overlong_penalty(longest_turn, max_tokens, buffer)
    groups = _group_index([trajectories[i].group_id for i in usable])
    advantages = compute_advantages(algorithm.advantage, rewards, groups)
    keep = torch.ones(len(usable), dtype=torch.bool)
    if algorithm.dynamic_sampling:
        keep &= zero_variance_groups(rewards, groups)
    if algorithm.overlong.filter:
        keep &= torch.tensor([not _hit_length(trajectories[i]) for i in usable])
    samples = [_sample(trajectories[i], float(advantages[k]), i) for k, i in enumerate(usable) if keep[k]]
    stats |= {
        "batch/kept": float(len(samples)),
        "batch/zero_variance_groups": float(_dropped_groups(rewards, groups)) if algorithm.dynamic_sampling else 0.0,
        "batch/advantage_abs_mean": float(advantages.abs().mean()),
    }
    return Batch(samples, stats)


def pack(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Group sequence indices into bins whose padded size (count x longest) fits ``budget``.

    First-fit decreasing: longest sequences first, each into the first bin where it fits. A
    sequence longer than the budget gets a bin of its own (it cannot be split).
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    for i in order:
        for b in bins:
            longest = max(lengths[j] for j in b)  # b is sorted by length: b[0] is the longest
            if (len(b) + 1) * max(longest, lengths[i]) <= budget:
                b.append(i)
                break
        else:
            bins.append([i])
    return bins


def micro_batches(batch: Batch, budget: int, pad_id: int) -> list[MicroBatch]:
    """The batch as right-padded micro-batches of at most ``budget`` padded tokens each."""
    bins = pack([len(s) for s in batch.samples], budget)
    return [collate([batch.samples[i] for i in b], b, pad_id) for b in bins]


def collate(samples: Sequence[Sample], indices: list[int], pad_id: int) -> MicroBatch:
    """Right-pad ``samples`` into one micro-batch (targets shifted by one position)."""
    width = max(len(s) for s in samples)
    n = len(samples)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width - 1), dtype=torch.float32)
    sampler = torch.zeros((n, width - 1), dtype=torch.float32)
    for row, s in enumerate(samples):
        length = len(s)
        input_ids[row, :length] = torch.tensor(s.token_ids)
        attention[row, :length] = 1
        mask[row, : length - 1] = torch.tensor(s.loss_mask[1:], dtype=torch.float32)
        sampler[row, : length - 1] = torch.tensor(s.sampler_logprobs[1:], dtype=torch.float32)
    advantages = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    return MicroBatch(input_ids, attention, mask, sampler, advantages, list(indices))


# -- helpers ----------------------------------------------------------------------------------


def _trainable(t: Trajectory) -> bool:
    """Has a token record with policy tokens, and nothing failed outside the policy's control."""
    return t.ok and t.token_ids is not None and t.loss_mask is not None and any(t.loss_mask)


def _sample(t: Trajectory, advantage: float, index: int) -> Sample:
    assert t.token_ids is not None and t.loss_mask is not None
    logprobs = t.sampler_logprobs if t.sampler_logprobs is not None else [0.0] * len(t.token_ids)
    return Sample(list(t.token_ids), list(t.loss_mask), list(logprobs), advantage, index)


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
