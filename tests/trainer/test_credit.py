"""Per-turn rewards end to end: the runner records each step's reward, each turn's reward is
matched with the tokens it sampled, and ``credit: turn`` puts each turn's advantage on exactly
those tokens (tool replies and the template get none). The default config is today's."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

import envhub
from envhub.env import Env
from envhub.envs.calculator import reference_policy
from envhub.rollout.runner import RolloutRunner
from envhub.testing import ByteChatTokenizer, ScriptedEngine
from envhub.trainer.algorithms import compute_advantages, make_kl_controller
from envhub.trainer.batch import build_batch, collate, micro_batches
from envhub.trainer.config import AlgorithmConfig
from envhub.trainer.credit import turn_rewards, turn_spans
from envhub.trainer.kl_reward import charge_kl
from envhub.trainer.scoring import estimate_advantages, score
from envhub.types import Message, Trajectory, user


def two_calls_then_answer(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
    """Three turns: the calculator's call twice, then the boxed result."""
    if sum(m.role == "tool" for m in messages) >= 2:
        return reference_policy(messages, tools)
    return reference_policy([m for m in messages if m.role in ("system", "user")], tools)


@pytest.fixture(scope="module")
def episode() -> tuple[Trajectory, ByteChatTokenizer]:
    tokenizer = ByteChatTokenizer()
    engine = ScriptedEngine(two_calls_then_answer, tokenizer=tokenizer)
    runner = RolloutRunner(engine, lambda: envhub.make("calculator"), max_concurrency=1, seed=5)
    [trajectory] = asyncio.run(runner.run([2], samples_per_task=1))
    return trajectory, tokenizer


def assistant_spans(t: Trajectory, tokenizer: ByteChatTokenizer) -> list[tuple[int, int]]:
    """Where each assistant turn sits, found independently: the render of the history before it."""
    spans = []
    for k, message in enumerate(t.messages):
        if message.role == "assistant":
            start = len(tokenizer.render_sync(t.messages[:k], t.tools, True))
            span = tokenizer.encode(message.content or "") + [tokenizer.eos_token_id]
            assert t.token_ids[start : start + len(span)] == span
            spans.append((start, start + len(span)))
    return spans


def test_the_runner_records_each_steps_reward_and_the_episode_reward_is_their_sum(
    episode: tuple[Trajectory, ByteChatTokenizer],
) -> None:
    t, tokenizer = episode
    assert [m.role for m in t.completion] == ["assistant", "tool"] * 2 + ["assistant"]
    assert [turn.reward for turn in t.turns] == [0.0, 0.0, 1.0]  # a TaskEnv pays at the end
    assert t.reward == 1.0 == sum(turn.reward for turn in t.turns)
    assert turn_spans(t) == assistant_spans(t, tokenizer)
    assert turn_rewards(t, t.reward).tolist() == [0.0, 0.0, 1.0]


class StepRewards(Env):
    """Three steps that pay 0.25, 0.5 and 1.0."""

    name = "step-rewards"
    REWARDS = (0.25, 0.5, 1.0)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self.turn = 0
        return [user("go")], {}

    def step(self, action: Any) -> Any:
        self.turn += 1
        return [user("next")], self.REWARDS[self.turn - 1], self.turn == 3, False, {}


def test_an_env_that_pays_every_step_gets_the_sum_and_each_turn_its_own() -> None:
    engine = ScriptedEngine(lambda m, t: "ok", tokenizer=ByteChatTokenizer())
    [t] = asyncio.run(RolloutRunner(engine, StepRewards, max_concurrency=1).run([0]))
    assert [turn.reward for turn in t.turns] == [0.25, 0.5, 1.0]
    assert t.reward == 1.75
    assert turn_rewards(t, t.reward).tolist() == [0.25, 0.5, 1.0]
    # What no step returned (the overlong penalty here: -0.25) goes to the last turn.
    assert turn_rewards(t, 1.5).tolist() == [0.25, 0.5, 0.75]
    spans = turn_spans(t)
    assert [b - a for a, b in spans] == [3, 3, 3]  # "ok" + <|im_end|>


def _pair(t: Trajectory) -> list[Trajectory]:
    """The episode and a failed twin in its group (reward 0 on every turn)."""
    turns = [turn.model_copy(update={"reward": 0.0}) for turn in t.turns]
    return [t, t.model_copy(update={"reward": 0.0, "sample_index": 1, "turns": turns})]


def test_credit_turn_puts_each_turns_advantage_on_its_tokens_only(
    episode: tuple[Trajectory, ByteChatTokenizer],
) -> None:
    t, tokenizer = episode
    config = AlgorithmConfig(credit="turn", gamma=0.5, advantage="dr_grpo")
    batch = build_batch(_pair(t), config, max_tokens=512)
    # Returns: [0.25, 0.5, 1] and [0, 0, 0]; per turn position the group mean is half of it.
    turn_advantage = [0.125, 0.25, 0.5]
    expected = [0.0] * len(t.token_ids)
    for (start, end), value in zip(assistant_spans(t, tokenizer), turn_advantage, strict=True):
        expected[start:end] = [value] * (end - start)
    first, twin = batch.samples
    assert first.token_advantages == pytest.approx(expected, abs=1e-12)
    assert twin.token_advantages == pytest.approx([-a for a in expected], abs=1e-12)
    assert first.advantage == pytest.approx(0.125)  # the first turn's
    for position, (value, sampled) in enumerate(zip(expected, t.loss_mask, strict=True)):
        assert bool(value) == bool(sampled), f"token {position}: prompt/tool tokens get nothing"
    mb = collate(batch.samples, [0, 1], pad_id=0)
    assert mb.advantages.shape == mb.loss_mask.shape
    for target in range(len(t.token_ids) - 1):  # target t scores token t + 1
        assert mb.advantages[0, target].item() == pytest.approx(expected[target + 1], abs=1e-7)


def test_turn_credit_without_discount_on_an_end_reward_is_episode_credit(
    episode: tuple[Trajectory, ByteChatTokenizer],
) -> None:
    t, _ = episode
    pair = _pair(t)
    by_turn = build_batch(pair, AlgorithmConfig(credit="turn"), max_tokens=512)
    by_episode = build_batch(pair, AlgorithmConfig(), max_tokens=512)
    for turned, whole in zip(by_turn.samples, by_episode.samples, strict=True):
        assert turned.advantage == whole.advantage
        assert turned.token_advantages == [whole.advantage if m else 0.0 for m in whole.loss_mask]


def test_the_default_config_is_todays_episode_credit(
    episode: tuple[Trajectory, ByteChatTokenizer],
) -> None:
    config = AlgorithmConfig()
    assert (config.credit, config.gamma, config.kl_in_reward) == ("episode", 1.0, None)
    assert not config.needs_reference
    trajectories = [*_pair(episode[0]), *_pair(episode[0].model_copy(update={"group_id": "g9"}))]
    trajectories[2] = trajectories[2].model_copy(update={"reward": 0.3})
    scored = score(trajectories, config, max_tokens=512)
    advantages = estimate_advantages(scored, config)
    assert advantages.tokens is None
    assert torch.equal(
        advantages.sequence, compute_advantages("grpo", scored.rewards, scored.groups)
    )
    batch = build_batch(trajectories, config, max_tokens=512)
    assert all(s.token_advantages is None for s in batch.samples)


class FakeBackend:
    """Policy logprob -1 and reference -1.5 on every token: k1 KL 0.5 per token."""

    def micro_batches(self, batch: Any) -> Any:
        return micro_batches(batch, 10_000, pad_id=0)

    def logprobs(self, batches: list[Any], reference: bool = False) -> list[torch.Tensor]:
        return [torch.full(mb.loss_mask.shape, -1.5 if reference else -1.0) for mb in batches]


def test_kl_in_the_reward_is_charged_per_token_and_taken_off_the_rewards(
    episode: tuple[Trajectory, ByteChatTokenizer],
) -> None:
    t, tokenizer = episode
    pair = _pair(t)
    config = AlgorithmConfig(advantage="dr_grpo", kl_in_reward={"coef": 0.2})
    assert config.needs_reference
    scored = score(pair, config, max_tokens=512)
    controller = make_kl_controller("adaptive", 0.2, target_kl=0.25, horizon=4)
    charged, metrics = charge_kl(scored, FakeBackend(), controller)
    assert metrics == {"kl_in_reward/kl": 0.5, "kl_in_reward/coef": 0.2}
    assert controller.coef == pytest.approx(0.2 * (1 + 0.2 * 2 / 4))  # error clipped to 0.2
    assert torch.equal(charged.rewards, scored.rewards)  # dynamic sampling judges the env's
    penalty = charged.kl_penalty[0].tolist()
    assert penalty == pytest.approx([0.1 if m else 0.0 for m in t.loss_mask])  # 0.2 * 0.5
    # Episode credit: both sequences lose 0.1 per sampled token, equally: Dr.GRPO's 0.5, -0.5.
    episode_adv = estimate_advantages(charged, config)
    assert episode_adv.sequence.tolist() == pytest.approx([0.5, -0.5])
    # Turn credit, gamma 1: each turn loses 0.1 x its tokens; returns differ by the end reward
    # only, as the twin has the same tokens, so the advantages are as without the KL.
    spans = assistant_spans(t, tokenizer)
    turn_config = AlgorithmConfig(credit="turn", advantage="dr_grpo", kl_in_reward={"coef": 0.2})
    per_turn = estimate_advantages(charged, turn_config)
    assert per_turn.turns.tolist() == pytest.approx([0.5] * 3 + [-0.5] * 3)
    # One trajectory, REINFORCE++: the KL cost of each turn's tokens enters its return.
    costs = [0.1 * (end - start) for start, end in spans]
    returns = torch.tensor([1.0 - sum(costs[k:]) for k in range(3)], dtype=torch.float64)
    lone = charged.__class__(
        charged.trajectories[:1],
        [0],
        charged.rewards[:1],
        torch.tensor([0]),
        charged.kl_penalty[:1],
    )
    config_pp = AlgorithmConfig(credit="turn", advantage="reinforce++", kl_in_reward={"coef": 0.2})
    whitened = (returns - returns.mean()) / (returns.std() + 1e-6)
    assert estimate_advantages(lone, config_pp).turns.tolist() == pytest.approx(whitened.tolist())
