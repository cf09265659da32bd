"""Every episode ends as one outcome: ok, policy failure, env failure, infrastructure failure or
timeout. Each kind is produced here by a real runner episode (a scripted engine, small envs that
fail on purpose), and counted by the eval summary."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx

from envhub.env import Env, SingleTurnEnv
from envhub.errors import EngineError, SandboxUnavailableError
from envhub.evaluation import summarize
from envhub.inference.base import SamplingParams
from envhub.multiturn import MultiTurnEnv
from envhub.rewards.rubric import Rubric, reward
from envhub.rollout.runner import RolloutRunner
from envhub.state import State
from envhub.testing import ByteChatTokenizer, ScriptedEngine, replay
from envhub.types import AssistantTurn, ErrorRecord, Message, Trajectory, user

TASKS = [{"question": f"q{i}", "answer": f"a{i}"} for i in range(8)]


def answer(messages: list[Message], tools: Any) -> str:
    """Answers q{i} with a{i}; the engine breaks down on q5."""
    question = next(m.content or "" for m in messages if m.role == "user")
    if question == "q5":
        raise EngineError("the server went away")
    return "a" + question[1:]


@reward
def exact(response: str, answer: str) -> float:
    """1 for the reference answer."""
    return float(response == answer)


@reward
def judged(response: str, task: dict[str, Any]) -> float:
    """Breaks for q3 (a bug in the reward) and q4 (its sandbox is not there)."""
    if task["question"] == "q3":
        raise KeyError("score")
    if task["question"] == "q4":
        raise SandboxUnavailableError("bwrap is not installed")
    return 1.0


class Failing(SingleTurnEnv):
    """q1's reset raises, q2's step raises; the rubric fails on q3 and q4."""

    name = "failing"

    def __init__(self) -> None:
        super().__init__(TASKS, rubric=Rubric([exact, judged]))

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if (options or {}).get("task_index") == 1:
            raise RuntimeError("reset broke")
        return await super().areset(seed=seed, options=options)

    async def env_response(self, state: State, turn: AssistantTurn) -> list[Message]:
        if state.task_index == 2:
            raise ValueError("step broke")
        if state.task_index == 6:
            raise httpx.ConnectError("the game server refused the connection")
        return await super().env_response(state, turn)


def run(runner: RolloutRunner, tasks: list[int]) -> list[Trajectory]:
    return asyncio.run(runner.run(tasks))


def test_each_failure_has_its_outcome_and_the_summary_counts_them() -> None:
    runner = RolloutRunner(ScriptedEngine(answer, ByteChatTokenizer()), Failing)
    ok, reset, step, reward_bug, sandbox, engine, network = run(runner, [0, 1, 2, 3, 4, 5, 6])
    assert [t.outcome for t in (ok, reset, step, reward_bug, sandbox, engine, network)] == [
        "ok",
        "env_failure",
        "env_failure",
        "env_failure",
        "infra_failure",
        "infra_failure",
        "infra_failure",
    ]
    assert sandbox.errors == [
        ErrorRecord(
            stage="reward:judged",
            type="SandboxUnavailableError",
            message="bwrap is not installed",
            infra=True,
        )
    ]
    assert network.errors == [
        ErrorRecord(
            stage="env.step",
            type="ConnectError",
            message="the game server refused the connection",
            turn=0,
            infra=True,
        )
    ]
    assert [e.infra for t in (reset, step, reward_bug) for e in t.errors] == [False] * 3
    assert engine.errors[0].infra and engine.errors[0].stage == "engine"
    summary = summarize([ok, reset, step, reward_bug, sandbox, engine, network])
    assert summary.outcomes == {
        "ok": 1,
        "policy_failure": 0,
        "env_failure": 3,
        "infra_failure": 3,
        "timeout": 0,
    }


class Chatter(MultiTurnEnv):
    """Never ends by itself; each reply takes a moment (so an episode timeout can fire)."""

    name = "chatter"

    async def env_response(self, state: State, turn: AssistantTurn) -> list[Message]:
        await asyncio.sleep(0.01)
        return [user("go on")]

    def default_rubric(self) -> Rubric:
        return Rubric([exact])


class Hanging(Env):
    """A sync env whose step blocks until released."""

    name = "hanging"

    def __init__(self, release: threading.Event) -> None:
        super().__init__()
        self.release = release

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        return [user("q0")], {}

    def step(self, action: Any):
        self.release.wait(10)
        return [], 1.0, True, False, {}


def test_budgets_are_policy_failures_and_hangs_are_timeouts() -> None:
    engine = ScriptedEngine(replay("more"), ByteChatTokenizer())
    turns, tokens = run(RolloutRunner(engine, lambda: Chatter(TASKS, max_turns=2)), [0]) + run(
        RolloutRunner(
            engine, lambda: Chatter(TASKS, max_tokens=8), sampling=SamplingParams(max_tokens=5)
        ),
        [0],
    )
    assert [(t.stop_reason, t.outcome) for t in (turns, tokens)] == [
        ("max_turns", "policy_failure"),
        ("max_tokens", "policy_failure"),
    ]
    release = threading.Event()
    runner = RolloutRunner(ScriptedEngine(replay("x")), lambda: Hanging(release), step_timeout=0.1)

    async def abandon() -> list[Trajectory]:
        try:
            return await runner.run([0])
        finally:
            release.set()  # let the abandoned worker thread end before the loop closes

    (hung,) = asyncio.run(abandon())
    (slow,) = run(
        RolloutRunner(
            ScriptedEngine(replay("more")),
            lambda: Chatter(TASKS, max_turns=10**6),
            episode_timeout=0.2,
        ),
        [0],
    )
    assert [(t.stop_reason, t.errors[0].stage, t.outcome) for t in (hung, slow)] == [
        ("timeout", "env.step", "timeout"),
        ("timeout", "episode", "timeout"),
    ]


def test_the_outcome_is_saved_with_the_trajectory_and_recomputed_on_load() -> None:
    runner = RolloutRunner(ScriptedEngine(answer), Failing)
    (engine,) = run(runner, [5])
    saved = engine.model_dump(mode="json")
    assert saved["outcome"] == "infra_failure"
    saved["outcome"] = "ok"  # a stale or edited value is not trusted: errors decide
    assert Trajectory.model_validate(saved).outcome == "infra_failure"
