"""From trajectories to tensors: advantages, filtering, packing and target alignment, exactly."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from envhub.trainer.batch import (
    COLD_START,
    NoSignal,
    Packing,
    Sample,
    bin_of_sequence,
    build_batch,
    collate,
    micro_batches,
    no_signal,
    pack,
    pack_sharing_prompts,
    prompt_length,
    select,
)
from envhub.trainer.config import AlgorithmConfig, OverlongConfig
from envhub.trainer.scoring import estimate_advantages, score
from envhub.types import EnvRef, ErrorRecord, Message, Trajectory, TurnRecord


def _traj(
    group: str,
    reward: float,
    ids: list[int],
    mask: list[int],
    *,
    errors: bool = False,
    finish: str = "stop",
    tokens: int | None = None,
) -> Trajectory:
    return Trajectory(
        env=EnvRef(name="t"),
        task_index=0,
        group_id=group,
        messages=[Message(role="user", content="q")],
        prompt_length=1,
        token_ids=ids,
        loss_mask=mask,
        sampler_logprobs=[-0.5 if m else 0.0 for m in mask],
        reward=reward,
        turns=[
            TurnRecord(
                completion_tokens=tokens if tokens is not None else sum(mask), finish_reason=finish
            )
        ],
        errors=[ErrorRecord(stage="env.step", type="RuntimeError", message="boom")]
        if errors
        else [],
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
    assert [s.advantage for s in batch.samples] == pytest.approx(
        [(2 / 3) / std, (-1 / 3) / std, (-1 / 3) / std], rel=1e-5
    )
    assert batch.stats["batch/zero_variance_groups"] == 1.0
    assert batch.num_tokens == 6 and batch.num_sequences == 3


def test_failed_and_tokenless_trajectories_stay_out_of_the_loss() -> None:
    no_tokens = _traj("a", 1.0, [1], [0]).model_copy(update={"token_ids": None, "loss_mask": None})
    trajectories = [
        _traj("a", 1.0, [1, 2], [0, 1]),
        _traj("a", 0.0, [1, 3], [0, 1], errors=True),
        no_tokens,
        _traj("a", 0.0, [1, 4], [0, 1]),
    ]
    batch = build_batch(trajectories, AlgorithmConfig(), max_tokens=8)
    assert [s.trajectory for s in batch.samples] == [0, 3]
    assert batch.stats["batch/unusable"] == 2.0
    assert [s.advantage for s in batch.samples] == pytest.approx(
        [0.5 / 0.5**0.5, -0.5 / 0.5**0.5], rel=1e-5
    )


def test_overlong_filter_and_soft_penalty() -> None:
    trajectories = [
        _traj("a", 1.0, [1, 2], [0, 1], tokens=6),
        _traj("a", 1.0, [1, 3], [0, 1], finish="length", tokens=8),
        _traj("a", 0.0, [1, 4], [0, 1], tokens=2),
    ]
    algorithm = AlgorithmConfig(
        advantage="dr_grpo", overlong=OverlongConfig(filter=True, soft_penalty_buffer=4)
    )
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


def test_pack_without_padding_counts_real_tokens() -> None:
    # 5 opens a bin, 4 joins it (9); 3 would make 12: a second bin; each 2 would make the
    # first 11, so both join the second (5, then 7)
    assert pack([5, 3, 4, 2, 2], budget=10, padded=False) == [[0, 2], [1, 3, 4]]
    assert pack([6, 4, 3, 3], budget=10, padded=False) == [
        [0, 1],
        [2, 3],
    ]  # 6+4 fills a bin exactly
    assert pack([6, 4, 3, 3], budget=10) == [
        [0],
        [1, 2],
        [3],
    ]  # padded: 2 x 6 > 10, then 3 x 4 > 10
    assert bin_of_sequence([[0, 1], [2, 3]]) == {0: 0, 1: 0, 2: 1, 3: 1}


def _packing_batch() -> tuple:
    """Three sequences of lengths 4, 2 and 3, right-padded to width 4."""
    trajectories = [
        _traj("a", 1.0, [10, 11, 12, 13], [0, 0, 1, 1]), _traj("a", 0.0, [20, 21], [0, 1]),
        _traj("b", 1.0, [30, 31, 32], [0, 1, 1]), _traj("b", 0.0, [40, 41], [0, 1]),
    ]  # fmt: skip
    batch = build_batch(trajectories, AlgorithmConfig(), max_tokens=8)
    mb = collate(batch.samples[:3], [0, 1, 2], pad_id=0)
    return mb, Packing.of(mb)


def test_packing_lays_sequences_end_to_end() -> None:
    mb, packing = _packing_batch()
    assert packing.lengths == (4, 2, 3)
    assert packing.starts == [0, 4, 6]
    assert packing.total == 9
    assert packing.cu_seqlens().tolist() == [0, 4, 6, 9]
    assert packing.row(mb.input_ids).tolist() == [[10, 11, 12, 13, 20, 21, 30, 31, 32]]
    assert packing.positions().tolist() == [[0, 1, 2, 3, 0, 1, 0, 1, 2]]


def test_packing_pads_the_row_to_a_multiple_as_its_own_segment() -> None:
    mb, _ = _packing_batch()
    packing = Packing.of(mb, multiple=4)
    assert packing.total == 12
    assert packing.segments == [4, 2, 3, 3]
    assert packing.cu_seqlens().tolist() == [0, 4, 6, 9, 12]
    assert packing.row(mb.input_ids, pad_id=7).tolist() == [
        [10, 11, 12, 13, 20, 21, 30, 31, 32, 7, 7, 7]
    ]
    assert packing.positions().tolist() == [[0, 1, 2, 3, 0, 1, 0, 1, 2, 0, 1, 2]]


def test_packed_attention_is_causal_within_each_sequence_only() -> None:
    packing = Packing((2, 3))
    allowed = (~packing.blocked()[0, 0]).int().tolist()
    assert allowed == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 1, 1, 1],
    ]


def test_unpack_returns_each_sequences_targets_to_its_padded_row() -> None:
    mb, packing = _packing_batch()
    # a value per packed target position t (scores row token t + 1): t itself, to trace it
    values = torch.arange(packing.total - 1, dtype=torch.float32).unsqueeze(0).requires_grad_()
    unpacked = packing.unpack(values, width=mb.input_ids.shape[1])
    # sequence 0 scores tokens 1..3 from positions 0..2; position 3 (13 -> 20) crosses into
    # sequence 1 and is dropped; sequence 1 scores from 4; 5 (21 -> 30) is dropped;
    # sequence 2 from 6, 7
    assert unpacked.tolist() == [[0.0, 1.0, 2.0], [4.0, 0.0, 0.0], [6.0, 7.0, 0.0]]
    assert unpacked.shape == mb.loss_mask.shape
    unpacked.sum().backward()
    assert values.grad.tolist() == [[1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0]]


def test_packed_row_scores_like_the_padded_batch() -> None:
    """A real causal LM (tiny Llama) scoring the packed row, masked block-diagonally with
    restarted positions, gives each sequence's padded logprobs."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    mb, packing = _packing_batch()
    ids = mb.input_ids % 64
    with torch.no_grad():
        padded = torch.log_softmax(
            model(ids, attention_mask=mb.attention_mask).logits[:, :-1], -1
        ).gather(-1, ids[:, 1:, None])[..., 0]
        row = packing.row(ids)
        mask = torch.zeros(packing.blocked().shape).masked_fill(packing.blocked(), float("-inf"))
        logits = model(row, attention_mask=mask, position_ids=packing.positions()).logits
        packed = torch.log_softmax(logits[:, :-1], -1).gather(-1, row[:, 1:, None])[..., 0]
    unpacked = packing.unpack(packed, ids.shape[1])
    valid = mb.attention_mask[:, 1:].bool()
    torch.testing.assert_close(unpacked[valid], padded[valid], rtol=0, atol=1e-5)


def test_collate_aligns_masks_and_logprobs_with_targets() -> None:
    trajectories = [
        _traj("a", 1.0, [10, 11, 12, 13], [0, 0, 1, 1]),
        _traj("a", 0.0, [20, 21], [0, 1]),
    ]
    batch = build_batch(trajectories, AlgorithmConfig(), max_tokens=8)
    mb = collate(batch.samples, [0, 1], pad_id=0)
    assert mb.input_ids.tolist() == [[10, 11, 12, 13], [20, 21, 0, 0]]
    assert mb.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    # position t predicts input_ids[t + 1]: the mask of token t + 1
    assert mb.loss_mask.tolist() == [[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]]
    assert mb.sampler_logprobs.tolist() == [[0.0, -0.5, -0.5], [-0.5, 0.0, 0.0]]
    # one advantage per target token, like loss_mask: the sequence's on each, 0 on padding
    a = 2**0.5 / 2
    assert mb.advantages.shape == mb.loss_mask.shape
    assert mb.advantages[0].tolist() == pytest.approx([a, a, a], rel=1e-5)
    assert mb.advantages[1].tolist() == pytest.approx([-a, 0.0, 0.0], rel=1e-5)
    # the float32 value of each sequence's advantage, as the (n,) tensor of before held it
    before = torch.tensor([s.advantage for s in batch.samples], dtype=torch.float32)
    assert torch.equal(mb.advantages[0], before[0].expand(3))


def test_micro_batches_cover_every_sample_once() -> None:
    trajectories = [
        _traj("a", float(i % 2), list(range(1, 3 + i)), [0] + [1] * (1 + i)) for i in range(6)
    ]
    batch = build_batch(trajectories, AlgorithmConfig(), max_tokens=16)
    mbs = micro_batches(batch, budget=12, pad_id=0)
    assert sorted(i for mb in mbs for i in mb.samples) == list(range(6))
    assert all(mb.input_ids.numel() <= 12 or len(mb.samples) == 1 for mb in mbs)
    assert sum(mb.num_tokens for mb in mbs) == batch.num_tokens
    assert all(mb.loss_mask.dtype == torch.float32 for mb in mbs)


def _no_signal(trajectories: list[Trajectory], **algorithm: Any) -> NoSignal | None:
    config = AlgorithmConfig(**algorithm)
    scored = score(trajectories, config, max_tokens=8)
    batch = select(scored, estimate_advantages(scored, config), config)
    return no_signal(scored, batch, pass_threshold=1.0)


def test_a_step_with_signal_has_no_reason() -> None:
    assert _no_signal([_traj("a", 1.0, [1, 2], [0, 1]), _traj("a", 0.0, [1, 3], [0, 1])]) is None


@pytest.mark.parametrize("dynamic_sampling", [True, False])
def test_groups_tied_at_zero_are_named_with_their_rewards(dynamic_sampling: bool) -> None:
    trajectories = [_traj(g, r, [1, 2], [0, 1]) for g, r in [("a", 0), ("a", 0), ("b", 0),
                    ("b", 0), ("c", 0.5), ("c", 0.5)]]  # fmt: skip
    # without dynamic sampling the samples are kept, but every advantage is 0: still nothing
    assert _no_signal(trajectories, dynamic_sampling=dynamic_sampling) == NoSignal(
        "every group's rewards are tied (2 groups at 0, 1 group at 0.5), so every advantage is 0",
        solved=False,
        hint=COLD_START,  # none passed: show the model how first
    )


def test_a_recorded_error_is_named_after_the_reason() -> None:
    trajectories = [_traj("a", 0.0, [1, 2], [0, 1]), _traj("a", 0.0, [1, 3], [0, 1])]
    trajectories[1] = trajectories[1].model_copy(
        update={"errors": [ErrorRecord(stage="reward:correct", type="TypeError", message="no")]}
    )
    assert _no_signal(trajectories).reason == (
        "every group's rewards are tied (1 group at 0), so every advantage is 0; "
        "first recorded error: reward:correct: TypeError: no"
    )


def test_failed_episodes_and_solved_steps_are_told_apart() -> None:
    failed = [_traj("a", 0.0, [1, 2], [0, 1], errors=True) for _ in range(2)]
    assert _no_signal(failed) == NoSignal(
        "none of the 2 episodes is trainable (failed, or no tokens); "
        "first recorded error: env.step: RuntimeError: boom",
        solved=False,
    )
    solved = _no_signal([_traj("a", 1.0, [1, 2], [0, 1]), _traj("a", 1.0, [1, 3], [0, 1])])
    assert solved is not None and solved.solved


def test_the_overlong_filter_emptying_the_step_is_named() -> None:
    trajectories = [_traj("a", r, [1, 2], [0, 1], finish="length") for r in (0.0, 1.0)]
    assert _no_signal(trajectories, overlong=OverlongConfig(filter=True)).reason == (
        "the overlong filter dropped every group with signal (all hit the length limit)"
    )


def test_bins_keep_a_prompts_samples_together_and_count_its_tokens_once() -> None:
    def sample(ids: list[int], trained_from: int) -> Sample:
        mask = [0] * trained_from + [1] * (len(ids) - trained_from)
        return Sample(ids, mask, [0.0] * len(ids), 1.0, 0)

    samples = [
        sample([5, 6, 7, 8, 9], 3),  # 0: prompt 5 6 7, rest 2
        sample([5, 6, 7, 10], 3),  # 1: rest 1
        sample([1, 2, 3], 1),  # 2: alone, 3
        sample([5, 6, 7, 1, 1, 1], 3),  # 3: rest 3
        sample([9] * 8, 8),  # 4: nothing trained, 8
    ]
    assert [prompt_length(s) for s in samples] == [3, 3, 1, 3, 8]
    # the prompt's group costs 3 + 3 + 2 + 1 = 9 tokens, not 15
    assert pack_sharing_prompts(samples, 10) == [[3, 0, 1], [4], [2]]
    # at 7 it splits longest first: [3] costs 6, [0, 1] costs 6
    assert pack_sharing_prompts(samples, 7) == [[4], [0, 1], [3], [2]]


def test_a_harness_episodes_earlier_segments_train_with_its_advantage() -> None:
    from envhub.types import TokenSegment

    earlier = TokenSegment(
        token_ids=[1, 8, 9], loss_mask=[0, 1, 1], sampler_logprobs=[0.0, -0.1, -0.2],
        prompt_token_count=1, first_turn=0,
    )  # fmt: skip
    split = _traj("a", 1.0, [1, 2, 3], [0, 1, 1]).model_copy(update={"segments": [earlier]})
    trajectories = [split, _traj("a", 0.0, [1, 2, 4], [0, 1, 1])]
    batch = build_batch(trajectories, AlgorithmConfig(), max_tokens=8)
    # GRPO over the two episodes (mean 1/2, unbiased std sqrt(1/2)); the split episode's two
    # sequences carry its advantage, and both count as sequences and tokens of the loss.
    advantage = 0.5 / 0.5**0.5
    assert [(s.trajectory, s.token_ids) for s in batch.samples] == [
        (0, [1, 2, 3]), (0, [1, 8, 9]), (1, [1, 2, 4]),
    ]  # fmt: skip
    assert [s.advantage for s in batch.samples] == pytest.approx(
        [advantage, advantage, -advantage], rel=1e-5
    )
    assert batch.samples[1].sampler_logprobs == [0.0, -0.1, -0.2]
    assert batch.num_sequences == 3 and batch.num_tokens == 6
    assert batch.stats["batch/segments_skipped"] == 0.0


def test_turn_credit_runs_on_across_a_harness_episodes_segments() -> None:
    """The split episode's turns: one in its earlier segment (its step paid 0.25), one in its
    last record; the episode reward is 1.0, so the turns' rewards are 0.25 and 0.75, their
    returns (gamma 1) 1.0 and 0.75. Turn 0 is compared with the other episode's only turn
    (reward 0.0): GRPO over (1.0, 0.0) gives +-0.5 / sqrt(1/2); turn 1 is alone at its
    position, so its advantage is 0."""
    from envhub.types import TokenSegment, TurnRecord

    earlier = TokenSegment(
        token_ids=[1, 8, 9], loss_mask=[0, 1, 1], sampler_logprobs=[0.0, -0.1, -0.2],
        prompt_token_count=1, first_turn=0,
    )  # fmt: skip
    split = _traj("a", 1.0, [1, 2, 3, 7], [0, 1, 1, 1]).model_copy(
        update={
            "segments": [earlier],
            "turns": [
                TurnRecord(completion_tokens=2, reward=0.25, finish_reason="stop"),
                TurnRecord(completion_tokens=3, finish_reason="stop"),
            ],
        }
    )
    trajectories = [split, _traj("a", 0.0, [1, 2, 4], [0, 1, 1])]
    batch = build_batch(trajectories, AlgorithmConfig(credit="turn"), max_tokens=8)
    a = 0.5 / 0.5**0.5
    assert [(s.trajectory, s.token_ids) for s in batch.samples] == [
        (0, [1, 2, 3, 7]), (0, [1, 8, 9]), (1, [1, 2, 4]),
    ]  # fmt: skip
    assert batch.samples[0].token_advantages == [0.0, 0.0, 0.0, 0.0]
    assert batch.samples[1].token_advantages == pytest.approx([0.0, a, a], rel=1e-5)
    assert batch.samples[1].advantage == pytest.approx(a, rel=1e-5)
    assert batch.samples[2].token_advantages == pytest.approx([0.0, -a, -a], rel=1e-5)
    assert batch.stats["batch/segments_skipped"] == 0.0


def test_a_segmented_episodes_length_and_turns_count_every_segment() -> None:
    """``lengths`` (the OPO estimator's input) counts the sampled tokens of every segment, and
    turns whose token counts do not fill the segments are refused with the reason."""
    from envhub.trainer.credit import record_turn_spans
    from envhub.trainer.scoring import score
    from envhub.types import TokenSegment, TurnRecord

    earlier = TokenSegment(
        token_ids=[1, 8, 9], loss_mask=[0, 1, 1], sampler_logprobs=[0.0, -0.1, -0.2],
        prompt_token_count=1, first_turn=0,
    )  # fmt: skip
    turns = [TurnRecord(completion_tokens=n, finish_reason="stop") for n in (2, 1, 2)]
    split = _traj("a", 1.0, [1, 2, 3, 5, 6], [0, 1, 0, 1, 1]).model_copy(
        update={"segments": [earlier], "turns": turns}
    )
    scored = score([split], AlgorithmConfig(), max_tokens=8)
    assert scored.lengths().tolist() == [5.0]
    assert record_turn_spans(split) == [[(1, 3)], [(1, 2), (3, 5)]]
    short = split.model_copy(update={"turns": turns[:1] + [turns[1]]})
    with pytest.raises(ValueError, match=r"completion_tokens \[1\] do not add up to its 3"):
        record_turn_spans(short)
