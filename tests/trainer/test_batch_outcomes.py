"""The trainer's usability rule reads one field, ``Trajectory.outcome``: a mixed batch of real
runner episodes keeps exactly the samples it kept when the rule was "no recorded error"."""

from __future__ import annotations

import asyncio
from typing import Any

from envhub.env import SingleTurnEnv
from envhub.errors import EngineError, SandboxUnavailableError
from envhub.multiturn import MultiTurnEnv
from envhub.rewards.rubric import Rubric, reward
from envhub.rollout.runner import RolloutRunner
from envhub.state import State
from envhub.testing import ByteChatTokenizer, ScriptedEngine, replay
from envhub.trainer.batch import build_batch
from envhub.trainer.config import AlgorithmConfig
from envhub.trainer.scoring import score
from envhub.types import TRAINED_OUTCOMES, AssistantTurn, Message, Trajectory, user

TASKS = [{"question": f"q{i}", "answer": f"a{i}"} for i in range(6)]


def answer(messages: list[Message], tools: Any) -> str:
    """Answers q{i} with a{i}; the engine breaks down on q4."""
    question = messages[-1].content or ""
    if question == "q4":
        raise EngineError("the server went away")
    return "a" + question[1:]


@reward
def judged(task: dict[str, Any]) -> float:
    """Has a bug on q2; its sandbox is missing on q3."""
    if task["question"] == "q2":
        raise KeyError("score")
    if task["question"] == "q3":
        raise SandboxUnavailableError("bwrap is not installed")
    return 1.0


class Failing(SingleTurnEnv):
    """q1's step raises."""

    name = "failing"

    def __init__(self) -> None:
        super().__init__(TASKS, rubric=Rubric([judged]))

    async def env_response(self, state: State, turn: AssistantTurn) -> list[Message]:
        if state.task_index == 1:
            raise ValueError("step broke")
        return await super().env_response(state, turn)


class Chatter(MultiTurnEnv):
    """Never ends by itself."""

    name = "chatter"

    async def env_response(self, state: State, turn: AssistantTurn) -> list[Message]:
        return [user("go on")]


def rollouts(engine: Any, factory: Any, tasks: list[int]) -> list[Trajectory]:
    return asyncio.run(RolloutRunner(engine, factory).run(tasks, 2))


def test_the_loss_keeps_ok_and_policy_failures_only_exactly_as_before() -> None:
    failing = rollouts(ScriptedEngine(answer, ByteChatTokenizer()), Failing, [0, 1, 2, 3, 4])
    budget = rollouts(
        ScriptedEngine(replay("more"), ByteChatTokenizer()),
        lambda: Chatter(TASKS, max_turns=2),
        [5],
    )
    text_only = rollouts(ScriptedEngine(answer), Failing, [0])
    trajectories = failing + budget + text_only
    assert [t.outcome for t in trajectories] == [
        *["ok"] * 2,
        *["env_failure"] * 4,  # the step, the reward's own bug
        *["infra_failure"] * 4,  # the reward's sandbox, the engine
        *["policy_failure"] * 2,
        *["ok"] * 2,  # no token record: nothing to train on either
    ]
    usable = score(trajectories, AlgorithmConfig(), max_tokens=512).usable
    assert usable == [0, 1, 10, 11]
    # The rule before outcomes existed: a token record, policy tokens and no recorded error.
    assert usable == [
        i
        for i, t in enumerate(trajectories)
        if not t.errors and t.token_ids is not None and any(t.loss_mask or [])
    ]
    assert {trajectories[i].outcome for i in usable} <= TRAINED_OUTCOMES
    batch = build_batch(trajectories, AlgorithmConfig(), max_tokens=512)
    assert (batch.stats["batch/trajectories"], batch.stats["batch/unusable"]) == (14.0, 10.0)
