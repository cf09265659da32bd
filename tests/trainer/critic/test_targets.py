"""GAE on trajectories against values worked out by hand: a 3-turn tool episode, GAE over its
tokens (the tool's reply skipped) and over its turns, with per-turn rewards, the KL penalty and
whitening. The numbers are those of ``algorithms/test_returns.py``, laid out as a trajectory."""

from __future__ import annotations

import pytest
import torch

from envhub.trainer.config import AlgorithmConfig
from envhub.trainer.critic.targets import gae_targets
from envhub.types import EnvRef, Trajectory, TurnRecord, user

# Tokens 0..9: the prompt (token 0, 1), turn 0 (tokens 2, 3), the tool's reply (4, 5), turn 1
# (6), the tool's reply (7), turn 2 (8, 9). Place t scores token t + 1, so the policy's places
# are 1, 2 | 5 | 7, 8, and each turn's reward sits on the place of its last token: 2, 5, 8.
LOSS_MASK = [0, 0, 1, 1, 0, 0, 1, 0, 1, 1]
PLACES = [0, 1, 1, 0, 0, 1, 0, 1, 1]


def _episode(turn_rewards: list[float]) -> Trajectory:
    turns = [
        TurnRecord(completion_tokens=n, reward=r)
        for n, r in zip([2, 1, 2], turn_rewards, strict=True)
    ]
    return Trajectory(
        env=EnvRef(name="tool-env"),
        task_index=0,
        group_id="g0",
        messages=[user("q")],
        prompt_length=1,
        token_ids=list(range(100, 110)),
        loss_mask=LOSS_MASK,
        turns=turns,
        reward=sum(turn_rewards),
    )


def _algorithm(**kwargs: object) -> AlgorithmConfig:
    return AlgorithmConfig(
        advantage="gae", dynamic_sampling=False, whiten_advantages=False, **kwargs
    )


def test_gae_over_tokens_with_per_turn_rewards_skips_the_tool_tokens() -> None:
    # Values on the policy's places 0.1, 0.2 | 0.3 | 0.4, 0.5; 9.0 elsewhere must be ignored.
    values = torch.tensor([9.0, 0.1, 0.2, 9.0, 9.0, 0.3, 9.0, 0.4, 0.5], dtype=torch.float64)
    t = _episode([0.0, 0.5, 1.0])
    result = gae_targets([t], torch.tensor([1.5]), [values], _algorithm(credit="turn", lam=0.5))
    # gamma 1, lambda 0.5, backwards over places 8, 7, 5, 2, 1 (see test_returns.py):
    advantages = [0.0, 0.34375, 0.4875, 0.0, 0.0, 0.775, 0.0, 0.35, 0.5]
    assert result.token_advantages[0] == pytest.approx([0.0, *advantages], abs=1e-12)
    target = result.value_targets[0]
    assert target.mask.tolist() == [bool(p) for p in PLACES]
    returns = [0.0, 0.44375, 0.6875, 0.0, 0.0, 1.075, 0.0, 0.75, 1.0]
    assert target.returns.tolist() == pytest.approx(returns, abs=1e-12)
    assert torch.equal(target.old_values, values)
    assert result.policy_tokens.tolist() == pytest.approx([0.34375, 0.4875, 0.775, 0.35, 0.5])


def test_credit_episode_puts_the_whole_reward_on_the_last_token() -> None:
    # lambda 1, zero values: every policy token's advantage is the return from it on, 1.5.
    values = torch.zeros(9, dtype=torch.float64)
    result = gae_targets([_episode([0.0, 0.5, 1.0])], torch.tensor([1.5]), [values], _algorithm())
    assert result.token_advantages[0] == [0.0, *(1.5 * p for p in PLACES)]


def test_gae_over_turns_values_each_turn_before_its_first_token() -> None:
    # Turn k is valued where its first token is scored: tokens 2, 6, 8 at places 1, 5, 7.
    values = torch.full((9,), 9.0, dtype=torch.float64)
    values[[1, 5, 7]] = torch.tensor([0.2, 0.4, 0.6], dtype=torch.float64)
    t = _episode([0.0, 0.5, 1.0])
    algorithm = _algorithm(credit="turn", gae_unit="turn", gamma=0.9, lam=0.8)
    result = gae_targets([t], torch.tensor([1.5]), [values], algorithm)
    # test_gae_over_three_turns_by_hand: A = 0.82816, 0.928, 0.4; returns 1.02816, 1.328, 1.0
    per_turn = [0.82816, 0.82816, 0.0, 0.0, 0.928, 0.0, 0.4, 0.4]
    assert result.token_advantages[0] == pytest.approx([0.0, 0.0, *per_turn], abs=1e-12)
    target = result.value_targets[0]
    assert target.mask.nonzero().flatten().tolist() == [1, 5, 7]
    assert target.returns[[1, 5, 7]].tolist() == pytest.approx([1.02816, 1.328, 1.0], abs=1e-12)
    assert target.returns.sum().item() == pytest.approx(1.02816 + 1.328 + 1.0)


def test_the_kl_penalty_is_charged_on_every_sampled_token() -> None:
    # lambda 1, zero values, gamma 1: A_t = the reward to come minus the penalty to come.
    penalty = torch.tensor([0.0, 0.0, 0.1, 0.1, 0.0, 0.0, 0.2, 0.0, 0.1, 0.1], dtype=torch.float64)
    result = gae_targets(
        [_episode([0.0, 0.5, 1.0])],
        torch.tensor([1.5]),
        [torch.zeros(9, dtype=torch.float64)],
        _algorithm(),
        kl_penalty=[penalty],
    )
    # to come from place 1: 1.5 - 0.6; 2: 1.5 - 0.5; 5: 1.5 - 0.4; 7: 1.5 - 0.2; 8: 1.5 - 0.1
    expected = [0.0, 0.0, 0.9, 1.0, 0.0, 0.0, 1.1, 0.0, 1.3, 1.4]
    assert result.token_advantages[0] == pytest.approx(expected, abs=1e-12)


def test_advantages_are_whitened_over_every_policy_token_of_the_batch() -> None:
    values = [torch.zeros(9, dtype=torch.float64), torch.full((9,), 0.5, dtype=torch.float64)]
    episodes = [_episode([0.0, 0.0, 1.0]), _episode([0.0, 0.0, 0.0])]
    algorithm = AlgorithmConfig(advantage="gae", dynamic_sampling=False)
    result = gae_targets(episodes, torch.tensor([1.0, 0.0]), values, algorithm)
    flat = result.policy_tokens
    assert flat.numel() == 10
    assert flat.mean().item() == pytest.approx(0.0, abs=1e-12)
    assert flat.std(unbiased=False).item() == pytest.approx(1.0, abs=1e-6)
    # Raw: 1.0 on the first episode's tokens, -0.5 on the second's: whitened +1 and -1.
    assert result.token_advantages[0][2] == pytest.approx(1.0, abs=1e-6)
    assert result.token_advantages[1][2] == pytest.approx(-1.0, abs=1e-6)
    assert result.token_advantages[1][4] == 0.0  # the tool's reply stays at 0
