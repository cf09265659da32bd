"""Multi-role envs served by the real ``envhub serve``: a RemoteEnv plays the same matches as
the local env, every actor's view, label, reward and result included."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import envhub
from envhub import registry
from envhub.envs.setter_solver import SetterSolverEnv
from envhub.envs.tictactoe import TicTacToeEnv
from envhub.rollout.runner import RolloutRunner
from envhub.testing import ByteChatTokenizer, ScriptedEngine
from envhub.types import Message, Trajectory

TIMINGS = {"seconds", "generate_seconds", "env_seconds"}


@pytest.fixture(scope="module", autouse=True)
def multi_role_envs() -> Iterator[None]:
    envhub.register("tic-tac-toe", TicTacToeEnv, override=True)
    envhub.register("setter-solver", SetterSolverEnv, override=True)
    yield
    for name in ("tic-tac-toe", "setter-solver"):
        registry._registered.pop(name, None)


def comparable(trajectory: Trajectory) -> dict[str, Any]:
    data = trajectory.model_dump(exclude={"seconds", "env"})
    data["turns"] = [{k: v for k, v in t.items() if k not in TIMINGS} for t in data["turns"]]
    return data


def roll_out(make: Callable[[], Any], policy: Any, tasks: list[int]) -> list[Trajectory]:
    engine = ScriptedEngine(policy, ByteChatTokenizer())
    runner = RolloutRunner(engine, make, max_concurrency=2, seed=3)
    return asyncio.run(runner.run(tasks, samples_per_task=2))


def first_free(messages: list[Message], tools: Any) -> str:
    board = [line for line in (messages[-1].content or "").splitlines() if "|" in line]
    cells = [c.strip() for line in board for c in line.split("|")]
    return next(c for c in cells if c.isdigit())


def classroom(messages: list[Message], tools: Any) -> str:
    if "You write arithmetic problems" in (messages[0].content or ""):
        return "<problem>(3 + 4) * 5</problem>"
    return "\\boxed{35}"


@pytest.mark.parametrize(
    ("env", "args", "policy", "roles"),
    [
        ("tic-tac-toe", {}, first_free, ["x", "o"]),
        ("tic-tac-toe", {"opponent": "random"}, first_free, ["x"]),
        ("setter-solver", {"attempts": 2}, classroom, ["setter", "solver#0", "solver#1"]),
    ],
)
def test_a_remote_multi_role_env_plays_the_same_matches_as_a_local_one(
    serve: Callable[..., Any], env: str, args: dict[str, Any], policy: Any, roles: list[str]
) -> None:
    url = serve(env, env_args=args).url()
    local = roll_out(lambda: envhub.make(env, **args), policy, [0, 9])
    remote = roll_out(lambda: envhub.make(url), policy, [0, 9])
    assert [t.role for t in local] == roles * 4
    assert [comparable(t) for t in remote] == [comparable(t) for t in local]
    assert all(t.outcome == "ok" for t in remote)
    assert any(m.actor is not None for t in remote for m in t.messages)


class PeakEngine(ScriptedEngine):
    """Counts the requests in flight at once (each yields to the loop before answering)."""

    def __init__(self, policy: Any) -> None:
        super().__init__(policy, ByteChatTokenizer())
        self.in_flight = self.peak = 0

    async def generate(self, request: Any) -> Any:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        await asyncio.sleep(0)
        self.in_flight -= 1
        return await super().generate(request)


def test_a_remote_setter_solver_lists_its_solvers_so_they_are_sampled_together(
    serve: Callable[..., Any],
) -> None:
    url = serve("setter-solver", env_args={"attempts": 3}).url()
    engine = PeakEngine(classroom)
    runner = RolloutRunner(engine, lambda: envhub.make(url), max_concurrency=1, seed=3)
    setter, *solvers = asyncio.run(runner.run([4]))
    assert engine.peak == 3 and engine.requests == 4  # info["upcoming"] crossed the wire
    assert [t.role for t in solvers] == ["solver#0", "solver#1", "solver#2"]
    assert all(t.reward == 1.0 for t in solvers) and setter.outcome == "ok"
