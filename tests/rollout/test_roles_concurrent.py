"""The solvers of a setter-solver episode are sampled together (the env lists them as
upcoming), yet recorded exactly as when each was sampled on its turn: the records of four
scenarios are compared, byte for byte but for timings, with those the runner made before
(``data/setter_solver_before_concurrent.json``, written by ``python -m
tests.rollout.test_roles_concurrent`` on the commit before the change).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from envhub.checks.checker import check_env
from envhub.envs.setter_solver import SetterSolverEnv
from envhub.errors import EngineError
from envhub.inference.base import GenerateRequest, Generation
from envhub.rollout.runner import RolloutRunner
from envhub.testing import ByteChatTokenizer, ScriptedEngine
from envhub.types import Message, Trajectory

BEFORE = Path(__file__).parent / "data" / "setter_solver_before_concurrent.json"
TIMINGS = {"seconds", "generate_seconds", "env_seconds"}
METRICS_ADDED_SINCE = {"problem_size"}
"""Episode metrics the env records that it did not when the record was made (left out here, so
the records still say whether sampling together changed anything)."""


def is_setter(messages: list[Message]) -> bool:
    return "You write arithmetic problems" in (messages[0].content or "")


class Classroom:
    """Setters and solvers answer in turn from ``problems`` and ``answers`` (a count of calls
    tells the solvers apart: they see the same problem)."""

    def __init__(self, problems: list[str], answers: list[str]) -> None:
        self.problems, self.answers = problems, answers
        self.setters = self.solvers = 0

    def __call__(self, messages: list[Message], tools: Any) -> str:
        if is_setter(messages):
            self.setters += 1
            return self.problems[(self.setters - 1) % len(self.problems)]
        self.solvers += 1
        return self.answers[(self.solvers - 1) % len(self.answers)]


def by_the_brief(messages: list[Message], tools: Any) -> str:
    """A policy whose reply depends on the request only: the setter adds ``operations + 1``
    numbers of ``digits`` digits; a solver answers right when the value is even."""
    if is_setter(messages):
        brief = messages[0].content or ""
        operations, digits = (int(w) for w in brief.split() if w.isdigit())
        numbers = [str(10 ** (digits - 1) + k) for k in range(operations + 1)]
        return f"<problem>{' + '.join(numbers)}</problem>"
    value = sum(int(n) for n in (messages[-1].content or "").split(" + "))
    return f"\\boxed{{{value if value % 2 == 0 else value + 1}}}"


class FailsOnSolverCall(ScriptedEngine):
    """Raises on the ``at``-th solver call (counting from 1): an engine failure."""

    def __init__(self, policy: Any, at: int) -> None:
        super().__init__(policy, tokenizer=ByteChatTokenizer())
        self.at, self.solver_calls = at, 0

    async def generate(self, request: GenerateRequest) -> Generation:
        if not is_setter(list(request.messages)):
            self.solver_calls += 1
            if self.solver_calls == self.at:
                raise EngineError("the server went away")
        return await super().generate(request)


def roll(engine: Any, env: Callable[[], Any], tasks: list[int], n: int, slots: int) -> list:
    runner = RolloutRunner(engine, env, max_concurrency=slots, seed=3)
    return asyncio.run(runner.run(tasks, samples_per_task=n))


def scenarios() -> dict[str, list[Trajectory]]:
    """Four rollouts with deterministic engines: varied answers (and an invalid problem) one
    episode at a time; a request-determined policy three episodes at a time; a solver's call
    failing; a fixed setter (the solvers' turns come with the reset)."""
    tokens = ByteChatTokenizer()
    problems = ["<problem>12 * 3 + 4</problem>", "<problem>7 - 9</problem>", "a hard one"]
    answers = ["\\boxed{40}", "41", "so -2", "7", "40"]
    return {
        "classroom": roll(
            ScriptedEngine(Classroom(problems, answers), tokens), SetterSolverEnv, [0, 5], 2, 1
        ),
        "by_the_brief": roll(
            ScriptedEngine(by_the_brief, tokens),
            lambda: SetterSolverEnv(attempts=3),
            [0, 1, 4, 7],
            2,
            3,
        ),
        "engine_failure": roll(
            FailsOnSolverCall(Classroom(problems[:1], answers), at=3), SetterSolverEnv, [2], 1, 1
        ),
        "fixed_setter": roll(
            ScriptedEngine(Classroom(problems, answers), tokens),
            lambda: SetterSolverEnv(policies={"setter": "random"}),
            [3, 6],
            2,
            1,
        ),
    }


def record(t: Trajectory) -> dict[str, Any]:
    """A trajectory's identity: everything it holds but timings, hashed, with a few fields
    to read."""
    data = t.model_dump(mode="json", exclude={"seconds"})
    data["turns"] = [{k: v for k, v in turn.items() if k not in TIMINGS} for turn in data["turns"]]
    data["metrics"] = {k: v for k, v in data["metrics"].items() if k not in METRICS_ADDED_SINCE}
    digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
    return {"role": t.role, "reward": t.reward, "outcome": t.outcome, "sha256": digest}


def test_solvers_sampled_together_are_recorded_as_when_sampled_in_turn() -> None:
    before = json.loads(BEFORE.read_text())
    now = {name: [record(t) for t in ts] for name, ts in scenarios().items()}
    assert now == before
    # The scenarios are not trivial: rewards vary, a problem is invalid, a solver crashes.
    roles = [r["role"] for r in before["classroom"]]
    assert roles.count("setter") == 4 and roles.count("solver#3") == 3  # one invalid problem
    assert {r["reward"] for r in before["classroom"]} == {-1.0, 0.0, 1.0}
    failed = before["engine_failure"]
    assert [(r["role"], r["outcome"]) for r in failed] == [
        ("setter", "infra_failure"),
        ("solver#0", "infra_failure"),
        ("solver#1", "infra_failure"),
        ("solver#2", "infra_failure"),
    ]


class Overlap(ScriptedEngine):
    """Counts the requests in flight at once (each yields to the loop before answering)."""

    def __init__(self, policy: Any) -> None:
        super().__init__(policy, tokenizer=ByteChatTokenizer())
        self.in_flight = self.peak = 0

    async def generate(self, request: GenerateRequest) -> Generation:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        await asyncio.sleep(0)
        self.in_flight -= 1
        return await super().generate(request)


def test_an_episodes_solvers_are_in_flight_together() -> None:
    engine = Overlap(Classroom(["<problem>2 + 2</problem>"], ["4"]))
    setter, *solvers = roll(engine, lambda: SetterSolverEnv(attempts=5), [0], 1, 1)
    assert engine.peak == 5 and engine.requests == 6
    assert [t.role for t in solvers] == [f"solver#{k}" for k in range(5)]
    assert setter.reward == 0.0 and all(t.reward == 1.0 for t in solvers)  # too easy


class Fickle(SetterSolverEnv):
    """Lists the solvers as upcoming, then tells solver#2 one more thing after solver#1's
    answer (breaking its own word)."""

    def play(self, match: Any, actor: str, turn: Any) -> None:
        super().play(match, actor, turn)
        if actor == "solver#1":
            match.tell("solver#2", Message(role="user", content="Hint: it is even."))


def test_a_turn_sampled_ahead_but_shown_something_else_is_sampled_again() -> None:
    engine = Overlap(Classroom(["<problem>2 + 2</problem>"], ["4"]))
    setter, *solvers = roll(engine, Fickle, [0], 1, 1)
    assert engine.requests == 1 + 4 + 1  # solver#2's turn again, on what it was really shown
    hinted = solvers[2]
    assert [m.content for m in hinted.messages[1:]] == ["2 + 2", "Hint: it is even.", "4"]
    assert all(t.reward == 1.0 for t in solvers)


def test_check_env_holds_an_env_to_its_upcoming_list() -> None:
    assert check_env(SetterSolverEnv(policies={"setter": "random"})).passed
    report = check_env(Fickle(policies={"setter": "random"}), raise_on_failure=False)
    details = " ".join(r.detail for r in report.failures)
    assert report.failures and "info['upcoming'] said solver#2 would be shown" in details
    assert "Hint: it is even." in details


if __name__ == "__main__":  # record the runner's behaviour (run on the commit before)
    records = {name: [record(t) for t in ts] for name, ts in scenarios().items()}
    BEFORE.write_text(json.dumps(records, indent=1) + "\n")
