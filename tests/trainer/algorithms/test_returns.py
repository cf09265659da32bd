"""Discounted returns, per-turn advantages and GAE against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from envhub.trainer.algorithms import discounted_returns, gae, per_turn_advantages
from envhub.trainer.credit import spread

R2 = 1 / math.sqrt(2)


def test_discounted_returns_sum_what_comes_after_each_step() -> None:
    # G2 = 2, G1 = 0 + 0.5 * 2 = 1, G0 = 1 + 0.5 * 1 = 1.5
    out = discounted_returns(torch.tensor([1.0, 0.0, 2.0]), gamma=0.5)
    assert out.tolist() == [1.5, 1.0, 2.0]
    assert discounted_returns(torch.tensor([1.0, 0.0, 2.0]), gamma=1.0).tolist() == [3, 2, 2]


def test_discounted_returns_skip_masked_steps() -> None:
    # The middle step is not the policy's: ignored, and not counted by the discount.
    rewards = torch.tensor([[1.0, 5.0, 2.0], [0.0, 0.0, 4.0]])
    mask = torch.tensor([[1, 0, 1], [1, 1, 1]])
    out = discounted_returns(rewards, gamma=0.5, mask=mask)
    assert out.tolist() == [[2.0, 0.0, 2.0], [1.0, 2.0, 4.0]]


def test_gae_over_three_turns_by_hand() -> None:
    # gamma 0.9, lambda 0.8, V after the last turn 0:
    # t2: delta = 1 + 0 - 0.6 = 0.4                     A2 = 0.4
    # t1: delta = 0.5 + 0.9*0.6 - 0.4 = 0.64            A1 = 0.64 + 0.72*0.4 = 0.928
    # t0: delta = 0 + 0.9*0.4 - 0.2 = 0.16              A0 = 0.16 + 0.72*0.928 = 0.82816
    rewards = torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64)
    values = torch.tensor([0.2, 0.4, 0.6], dtype=torch.float64)
    advantages, returns = gae(rewards, values, gamma=0.9, lam=0.8)
    assert advantages.tolist() == pytest.approx([0.82816, 0.928, 0.4], abs=1e-12)
    assert returns.tolist() == pytest.approx([1.02816, 1.328, 1.0], abs=1e-12)
    # lambda 0: the one-step TD errors
    td, _ = gae(rewards, values, gamma=0.9, lam=0.0)
    assert td.tolist() == pytest.approx([0.16, 0.64, 0.4], abs=1e-12)


def test_gae_bootstraps_from_the_value_after_a_cut_episode() -> None:
    advantages, _ = gae(torch.tensor([1.0]), torch.tensor([0.5]), 0.9, 0.95, last_value=2.0)
    assert advantages.tolist() == pytest.approx([1 + 0.9 * 2 - 0.5])


def test_gae_with_lambda_one_and_no_values_is_the_discounted_return() -> None:
    g = torch.Generator().manual_seed(0)
    rewards = torch.randn(3, 7, generator=g, dtype=torch.float64)
    mask = torch.rand(3, 7, generator=g) > 0.3
    advantages, returns = gae(rewards, torch.zeros_like(rewards), gamma=0.8, lam=1.0, mask=mask)
    expected = discounted_returns(rewards, 0.8, mask)
    assert torch.allclose(advantages, expected) and torch.allclose(returns, expected)


# A 3-turn tool episode as tokens: prompt, turn 0 (2 tokens), the tool's reply (2 tokens),
# turn 1 (1 token), the tool's reply (1 token), turn 2 (2 tokens). Each turn's reward sits on
# its last token; masked tokens hold garbage rewards and values that must be ignored.
MASK = [0, 1, 1, 0, 0, 1, 0, 1, 1]
TOKEN_REWARDS = [7.0, 0.0, 0.0, 7.0, 7.0, 0.5, 7.0, 0.0, 1.0]
TOKEN_VALUES = [9.0, 0.1, 0.2, 9.0, 9.0, 0.3, 9.0, 0.4, 0.5]
SPANS = [(1, 3), (5, 6), (7, 9)]


def test_gae_over_tokens_skips_the_tool_tokens() -> None:
    # gamma 1, lambda 0.5, backwards over the policy's tokens 8, 7, 5, 2, 1:
    # t8: delta = 1 + 0 - 0.5 = 0.5                      A = 0.5
    # t7: delta = 0 + 0.5 - 0.4 = 0.1                    A = 0.1 + 0.5*0.5 = 0.35
    # t5: delta = 0.5 + V7 0.4 - 0.3 = 0.6               A = 0.6 + 0.5*0.35 = 0.775
    # t2: delta = 0 + V5 0.3 - 0.2 = 0.1                 A = 0.1 + 0.5*0.775 = 0.4875
    # t1: delta = 0 + 0.2 - 0.1 = 0.1                    A = 0.1 + 0.5*0.4875 = 0.34375
    advantages, returns = gae(
        torch.tensor([TOKEN_REWARDS], dtype=torch.float64),
        torch.tensor([TOKEN_VALUES], dtype=torch.float64),
        gamma=1.0,
        lam=0.5,
        mask=torch.tensor([MASK]),
    )
    expected = [0.0, 0.34375, 0.4875, 0.0, 0.0, 0.775, 0.0, 0.35, 0.5]
    assert advantages[0].tolist() == pytest.approx(expected, abs=1e-12)
    targets = [0.0, 0.44375, 0.6875, 0.0, 0.0, 1.075, 0.0, 0.75, 1.0]
    assert returns[0].tolist() == pytest.approx(targets, abs=1e-12)


def test_gae_over_turns_spread_over_each_turns_tokens_leaves_tool_tokens_without_advantage():
    # The turn-level GAE of test_gae_over_three_turns_by_hand, on the episode's token layout.
    advantages, _ = gae(
        torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64),
        torch.tensor([0.2, 0.4, 0.6], dtype=torch.float64),
        gamma=0.9,
        lam=0.8,
    )
    tokens = spread(SPANS, advantages, len(MASK))
    expected = [0.0, 0.82816, 0.82816, 0.0, 0.0, 0.928, 0.0, 0.4, 0.4]
    assert tokens == pytest.approx(expected, abs=1e-12)
    assert [a for a, m in zip(tokens, MASK, strict=True) if not m] == [0.0] * 4


# Per-turn returns of five samples in two groups (ids 3 and 8):
#   A (3): 1, 2    B (3): 3, 4, 5    C (3): 5    D (8): 2, 0    E (8): 4, 2
# Positions: (3, 0) = 1, 3, 5 (mean 3, unbiased std 2); (3, 1) = 2, 4 (mean 3, std sqrt 2);
# (3, 2) = 5 alone; (8, 0) = 2, 4 (mean 3); (8, 1) = 0, 2 (mean 1).
RETURNS = [[1.0, 2.0], [3.0, 4.0, 5.0], [5.0], [2.0, 0.0], [4.0, 2.0]]
GROUPS = [3, 3, 3, 8, 8]


def _per_turn(name: str, **kwargs: object) -> list[list[float]]:
    returns = [torch.tensor(r, dtype=torch.float64) for r in RETURNS]
    out = per_turn_advantages(name, returns, torch.tensor(GROUPS), **kwargs)
    return [a.tolist() for a in out]


def _approx(actual: list[list[float]], expected: list[list[float]]) -> None:
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        assert a == pytest.approx(e, abs=1e-9)


def test_per_turn_grpo_compares_each_turn_with_the_same_turn_of_its_group() -> None:
    expected = [[-1.0, -R2], [0.0, R2, 0.0], [1.0], [-R2, -R2], [R2, R2]]
    _approx(_per_turn("grpo", eps=0.0), expected)


def test_per_turn_dr_grpo_and_rloo() -> None:
    _approx(_per_turn("dr_grpo"), [[-2, -1], [0, 1, 0], [2], [-1, -1], [1, 1]])
    # RLOO: minus the mean of the others at the same position: A0 = 1 - (3+5)/2 = -3, ...
    _approx(_per_turn("rloo"), [[-3, -2], [0, 2, 0], [3], [-2, -2], [2, 2]])


def test_per_turn_reinforce_pp_whitens_every_turn_of_the_batch() -> None:
    flat = [v for r in RETURNS for v in r]  # 10 turns, mean 2.8
    mean = sum(flat) / 10
    std = math.sqrt(sum((v - mean) ** 2 for v in flat) / 9)  # sqrt(25.6 / 9)
    assert std == pytest.approx(math.sqrt(25.6 / 9))
    expected = [[(v - mean) / std for v in r] for r in RETURNS]
    _approx(_per_turn("reinforce++", eps=0.0), expected)


def test_per_turn_reinforce_pp_baseline_centres_per_position_then_whitens() -> None:
    centred = [[-2, -1], [0, 1, 0], [2], [-1, -1], [1, 1]]  # mean 0, sum of squares 14
    std = math.sqrt(14 / 9)
    _approx(_per_turn("reinforce++_baseline", eps=0.0), [[v / std for v in r] for r in centred])


def test_per_turn_refuses_sequence_level_estimators() -> None:
    with pytest.raises(ValueError, match="'opo' cannot be applied per turn"):
        _per_turn("opo")


def test_one_turn_per_sample_is_the_episode_estimator() -> None:
    from envhub.trainer.algorithms import compute_advantages

    rewards = torch.tensor([1.0, 0.0, 0.5, 2.0], dtype=torch.float64)
    groups = torch.tensor([0, 0, 1, 1])
    for name in ("grpo", "dr_grpo", "rloo", "reinforce++", "reinforce++_baseline"):
        turns = per_turn_advantages(name, [r[None] for r in rewards], groups)
        assert torch.equal(torch.cat(turns), compute_advantages(name, rewards, groups))
