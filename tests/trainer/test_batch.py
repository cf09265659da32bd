"""From trajectories to tensors: advantages, filtering, packing and target alignment, exactly."""

from __future__ import annotations

import pytest
import torch

from envhub.trainer.batch import build_batch, collate, micro_batches, pack
from envhub.trainer.config import AlgorithmConfig, OverlongConfig
from envhub.types import EnvRef, ErrorRecord, Message, Trajectory, TurnRecord


def _traj(group: str, reward: float, ids: list[int], mask: list[int], *, errors: bool = False, finish: str = "stop", tokens: int | None = None) -> Trajectory:
    return Trajectory(
        env=EnvRef(name="t"), task_index=0, group_id=group, messages=[Message(role="user", content="q")], prompt_length=1,
        token_ids=ids, loss_mask=mask, sampler_logprobs=[-0.5 if m else 0.0 for m in mask], reward=reward,
        turns=[TurnRecord(completion_tokens=tokens if tokens is not None else sum(mask), finish_reason=finish)],
        errors=[ErrorRecord(stage="env.step", type="RuntimeError", message="boom")] if errors else [],
    )


def test_grpo_advantages_per_group_and_zero_variance_groups_dropped() -> None:
    trajectories = [
        _traj("a", 1.0, [1, 2, 3], [0, 1, 1]),
        _traj("a", 0.0, [1, 2, 4], [0, 1, 1]),
        _traj("a", 0.0, [1, 2, 5], [0, 1, 1]),
        _traj("b", 1.0, [1, 6], [0, 1]),
        _traj("b", 1.0, [1, 7], [0, 1]),
    ]
    batch = build_batch(trajectories, AlgorithmConfig(), max_tokens=8)
    # group a: mean 1/3, unbiased std sqrt(1/3); group b has no variance and is dropped
    std = (1 / 3) ** 0.5
    assert [s.trajectory for s in batch.samples] == [0, 1, 2]
    assert [s.advantage for s in batch.samples] == pytest.approx([(2 / 3) / std, (-1 / 3) / std, (-1 / 3) / std], rel=1e-5)
    assert batch.stats["batch/zero_variance_groups"] == 1.0
    assert batch.num_tokens == 6 and batch.num_sequences == 3


def test_failed_and_tokenless_trajectories_stay_out_of_the_loss() -> None:
    no_tokens = _traj("a", 1.0, [1], [0]).model_copy(update={"token_ids": None, "loss_mask": None})
    trajectories = [_traj("a", 1.0, [1, 2], [0, 1]), _traj("a", 0.0, [1, 3], [0, 1], errors=True), no_tokens, _traj("a", 0.0, [1, 4], [0, 1])]
    batch = build_batch(trajectories, AlgorithmConfig(), max_tokens=8)
    assert [s.trajectory for s in batch.samples] == [0, 3]
    assert batch.stats["batch/unusable"] == 2.0
    assert [s.advantage for s in batch.samples] == pytest.approx([0.5 / 0.5**0.5, -0.5 / 0.5**0.5], rel=1e-5)


def test_overlong_filter_and_soft_penalty() -> None:
    trajectories = [_traj("a", 1.0, [1, 2], [0, 1], tokens=6), _traj("a", 1.0, [1, 3], [0, 1], finish="length", tokens=8), _traj("a", 0.0, [1, 4], [0, 1], tokens=2)]
    algorithm = AlgorithmConfig(advantage="dr_grpo", overlong=OverlongConfig(filter=True, soft_penalty_buffer=4))
    batch = build_batch(trajectories, algorithm, max_tokens=8)
    # penalties for lengths 6, 8, 2 with max 8, buffer 4: (8-4-6)/4 = -0.5, (8-4-8)/4 = -1, 0
    rewards = [0.5, 0.0, 0.0]
    mean = sum(rewards) / 3
    assert [s.trajectory for s in batch.samples] == [0, 2]  # the truncated one is filtered out
    assert [s.advantage for s in batch.samples] == pytest.approx([0.5 - mean, 0.0 - mean])


def test_pack_fits_the_budget_first_fit_decreasing() -> None:
    # longest first: 5 opens a bin, 4 joins it (2 x 5 = 10), 3 opens a second (3 x 5 > 10),
    # both 2s join the 3 (3 x 3 = 9)
    assert pack([5, 3, 4, 2, 2], budget=10) == [[0, 2], [1, 3, 4]]
    assert pack([12, 1], budget=10) == [[0], [1]]  # too long for any bin: alone
    bins = pack([7, 7, 3, 3, 3, 1], budget=14)
    assert sorted(i for b in bins for i in b) == list(range(6))


def test_collate_aligns_masks_and_logprobs_with_targets() -> None:
    trajectories = [_traj("a", 1.0, [10, 11, 12, 13], [0, 0, 1, 1]), _traj("a", 0.0, [20, 21], [0, 1])]
    batch = build_batch(trajectories, AlgorithmConfig(), max_tokens=8)
    mb = collate(batch.samples, [0, 1], pad_id=0)
    assert mb.input_ids.tolist() == [[10, 11, 12, 13], [20, 21, 0, 0]]
    assert mb.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    # position t predicts input_ids[t + 1]: the mask of token t + 1
    assert mb.loss_mask.tolist() == [[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]]
    assert mb.sampler_logprobs.tolist() == [[0.0, -0.5, -0.5], [-0.5, 0.0, 0.0]]
    assert mb.advantages.tolist() == pytest.approx([2**0.5 / 2, -(2**0.5) / 2], rel=1e-5)


def test_micro_batches_cover_every_sample_once() -> None:
    trajectories = [_traj("a", float(i % 2), list(range(1, 3 + i)), [0] + [1] * (1 + i)) for i in range(6)]
    batch = build_batch(trajectories, AlgorithmConfig(), max_tokens=16)
    mbs = micro_batches(batch, budget=12, pad_id=0)
    assert sorted(i for mb in mbs for i in mb.samples) == list(range(6))
    assert all(mb.input_ids.numel() <= 12 or len(mb.samples) == 1 for mb in mbs)
    assert sum(mb.num_tokens for mb in mbs) == batch.num_tokens
    assert all(mb.loss_mask.dtype == torch.float32 for mb in mbs)
