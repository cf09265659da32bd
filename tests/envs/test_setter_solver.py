"""setter-solver: the setter's reward on a table of solve rates, what makes a problem valid,
and whole episodes with scripted setters and solvers."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import numpy as np
import pytest

from envhub.checks.checker import check_env
from envhub.envs.setter_solver import (
    SetterSolverEnv,
    nudged_reward,
    oracle_solver,
    problem_size,
    random_setter,
    read_problem,
    setter_reward,
    student_solve_probability,
    student_solver,
)
from envhub.rollout.runner import RolloutRunner
from envhub.testing import ByteChatTokenizer, ScriptedEngine
from envhub.types import Message, Trajectory


@pytest.mark.parametrize(
    ("rate", "band", "expected"),
    [
        (0.0, (0.25, 0.75), 0.0),  # never solved: too hard
        (0.25, (0.25, 0.75), 1.0),  # the band's ends are in it
        (0.5, (0.25, 0.75), 1.0),
        (0.75, (0.25, 0.75), 1.0),
        (1.0, (0.25, 0.75), 0.0),  # always solved: too easy
        (0.5, (0.5, 0.5), 1.0),
        (0.25, (0.5, 0.5), 0.0),
        (1 / 3, (0.3, 0.7), 1.0),
        (2 / 3, (0.7, 1.0), 0.0),
        (0.0, (0.0, 0.0), 1.0),
    ],
)
def test_setter_reward_by_hand(rate: float, band: tuple[float, float], expected: float) -> None:
    assert setter_reward(rate, band) == expected


@pytest.mark.parametrize(
    ("problem", "value", "size"),
    [
        ("(12 + 7) * 3", 57, (2 / 6 + 2 / 7) / 2),
        ("1 + 1", 2, (1 / 6 + 1 / 7) / 2),
        ("5 - 9", -4, (1 / 6 + 1 / 7) / 2),  # the value's digits, not its sign
        ("999 * 999 + 1 + 1 + 1 + 1", 998005, (5 / 6 + 6 / 7) / 2),
        ("9 * 9 + 9 + 9 + 9 + 9 + 9 + 9", 135, (1 + 3 / 7) / 2),  # 7 operations: capped at 1
    ],
)
def test_problem_size_by_hand(problem: str, value: int, size: float) -> None:
    assert problem_size(problem, value, max_operations=6, max_value=10**6) == pytest.approx(size)


@pytest.mark.parametrize(
    ("rate", "size", "nudge", "expected"),
    [
        (0.5, 0.2, 0.5, 1.0),  # in the band: the band's pay, whatever the size
        (1.0, 0.2, 0.5, 0.1),  # too easy: bigger is nearer the band
        (1.0, 0.8, 0.5, 0.4),
        (0.0, 0.2, 0.5, 0.4),  # too hard: smaller is nearer
        (0.0, 0.8, 0.5, 0.1),
        (1.0, 0.8, 0.0, 0.0),  # no nudge: nothing outside the band
    ],
)
def test_nudged_reward_by_hand(rate: float, size: float, nudge: float, expected: float) -> None:
    assert nudged_reward(rate, size, (0.25, 0.75), nudge) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("text", "problem", "value"),
    [
        ("<problem>(12 + 7) * 3</problem>", "(12 + 7) * 3", 57),
        ("Here it is:\n<problem> 5 - 9 </problem>\nGood luck", "5 - 9", -4),
        ("Sure!\n3 * 4 - 2", "3 * 4 - 2", 10),  # no tag: the last expression
        ("What is the answer for 6 + 2 * 2?", "6 + 2 * 2", 10),
        ("12 + 7 = 20\n\nThe answer is incorrect.", "12 + 7", 19),
        ("Take (3 + 4) * 2, then 5 - 1 and 9", "5 - 1", 4),
        ("<problem>1+1</problem> then <problem>2*3</problem>", "2*3", 6),
    ],
)
def test_valid_problems_and_their_exact_values(text: str, problem: str, value: int) -> None:
    assert read_problem(text, max_operations=6, max_value=10**6) == (problem, value)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "no problem written"),
        ("<problem>7</problem>", "no operation"),
        ("<problem>8 / 2</problem>", "only digits"),
        ("<problem>2 ** 3</problem>", "cannot evaluate"),
        ("<problem>x + 1</problem>", "only digits"),
        ("<problem>1+1+1+1+1+1+1+1</problem>", "7 operations; at most 6"),
        ("<problem>9999 * 9999</problem>", "larger than 1000000"),
        ("<problem>(1 + 2</problem>", "cannot evaluate"),
    ],
)
def test_invalid_problems_say_why(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why.replace("*", r"\*")):
        read_problem(text, max_operations=6, max_value=10**6)


def test_the_fixed_policies() -> None:
    env = SetterSolverEnv(policies={"setter": "random"})
    observation, info = env.reset(seed=4, options={"task_index": 5})  # 2 operations, 3 digits
    assert info["to_move"] == "solver#0"
    problem = observation[-1].content
    assert len(problem.split()) == 5 and all(len(n) == 3 for n in problem.split()[::2])
    rng = np.random.default_rng(0)
    assert oracle_solver(observation, rng) == f"\\boxed{{{read_problem(problem, 6, 10**6)[1]}}}"
    assert random_setter([observation[0]], rng).startswith("<problem>")


@pytest.mark.parametrize(
    ("size", "chance"),
    [
        (0.4, 0.5),
        (0.3, 1 / (1 + math.exp(-2))),
        (0.5, 1 / (1 + math.exp(2))),
        (0.0, 1 / (1 + math.exp(-8))),
    ],
)
def test_the_students_chance_by_hand(size: float, chance: float) -> None:
    assert student_solve_probability(size) == pytest.approx(chance)


def test_the_student_solves_small_problems_and_misses_big_ones() -> None:
    def answers(problem: str, n: int = 200) -> list[int]:
        rng = np.random.default_rng(0)
        messages = [Message(role="user", content=problem)]
        return [int(student_solver(messages, rng)[7:-1]) for _ in range(n)]

    small = answers("1 + 2")  # size (1/6 + 1/7) / 2 = 0.155: chance 0.9926
    big = answers("123456 * 7 + 1 - 2 + 3 + 4 + 5")  # 6 of 6 operations, 6 of 7 digits: 2.5e-5
    edge = answers("12 * 3 + 4")  # 2 operations, 2 digits: 0.31, chance 0.86
    assert small.count(3) >= 195 and big.count(864203) == 0
    assert 150 <= edge.count(40) <= 190
    assert all(1 <= a - 3 <= 9 for a in small if a != 3)  # a miss is off by 1-9
    env = SetterSolverEnv(policies={"solver": "student"})
    observation, info = env.reset(seed=0)
    assert info["to_move"] == "setter"  # the setter is the policy's; the student is the env's


class Classroom:
    """A scripted policy: the setter writes ``problem``; solver k answers ``answers[k]``
    (solvers of an episode play one after another, so a count tells them apart)."""

    def __init__(self, problem: str, answers: list[str]) -> None:
        self.problem, self.answers, self.solver_turns = problem, answers, 0

    def __call__(self, messages: list[Message], tools: Any) -> str:
        if "You write arithmetic problems" in (messages[0].content or ""):
            return self.problem
        answer = self.answers[self.solver_turns % len(self.answers)]
        self.solver_turns += 1
        return answer


def roll(policy: Any, tasks: list[int], n: int = 1, **kwargs: Any) -> list[Trajectory]:
    engine = ScriptedEngine(policy, tokenizer=ByteChatTokenizer())
    runner = RolloutRunner(engine, lambda: SetterSolverEnv(**kwargs), max_concurrency=1, seed=0)
    return asyncio.run(runner.run(tasks, samples_per_task=n))


def test_a_problem_at_the_solvers_edge_pays_the_setter() -> None:
    # 12 * 3 + 4 = 40; two of four solvers get it.
    classroom = Classroom("<problem>12 * 3 + 4</problem>", ["\\boxed{40}", "41", "so 40", "7"])
    setter, *solvers = roll(classroom, [0])
    assert [t.role for t in [setter, *solvers]] == ["setter", *(f"solver#{k}" for k in range(4))]
    assert [t.reward for t in solvers] == [1.0, 0.0, 1.0, 0.0]
    assert [t.info["role_result"] for t in solvers] == ["solved", "failed", "solved", "failed"]
    assert setter.reward == 1.0 and setter.info["role_result"] == "edge"
    assert setter.reward_components == {"edge": 1.0}
    assert setter.metrics["solve_rate"] == 0.5 and setter.metrics["in_band"] == 1.0
    assert setter.metrics["problem_size"] == pytest.approx((2 / 6 + 2 / 7) / 2)
    assert {t.group_key for t in solvers} == {"g0/s0/solver"} and setter.group_key == "g0/setter"
    # Every solver saw the problem, labelled as the setter's doing, and only that.
    assert all(
        [(m.role, m.content, m.actor) for m in t.messages[1:]]
        == [("user", "12 * 3 + 4", "setter"), ("assistant", t.messages[-1].content, t.role)]
        for t in solvers
    )


@pytest.mark.parametrize(
    ("answers", "reward", "result"),
    [(["\\boxed{40}"], 0.0, "too_easy"), (["\\boxed{0}"], 0.0, "too_hard")],
)
def test_a_problem_always_or_never_solved_pays_nothing(
    answers: list[str], reward: float, result: str
) -> None:
    setter, *solvers = roll(Classroom("<problem>12 * 3 + 4</problem>", answers), [0])
    assert (setter.reward, setter.info["role_result"]) == (reward, result)
    assert len(solvers) == 4


def test_with_a_nudge_two_too_easy_problems_no_longer_tie() -> None:
    small = roll(Classroom("<problem>2 + 2</problem>", ["\\boxed{4}"]), [0], nudge=0.5)[0]
    big = roll(Classroom("<problem>(12 + 7) * 3</problem>", ["\\boxed{57}"]), [0], nudge=0.5)[0]
    assert small.info["role_result"] == big.info["role_result"] == "too_easy"
    assert small.reward == pytest.approx(0.5 * (1 / 6 + 1 / 7) / 2)
    assert big.reward == pytest.approx(0.5 * (2 / 6 + 2 / 7) / 2)
    assert small.metrics["in_band"] == big.metrics["in_band"] == 0.0
    with pytest.raises(ValueError, match="nudge"):
        SetterSolverEnv(nudge=1.0)


def test_an_invalid_problem_is_the_setters_recorded_failure() -> None:
    [setter] = roll(Classroom("a hard one", ["40"]), [0])
    assert setter.reward == -1.0 and setter.info["role_result"] == "invalid"
    assert setter.reward_components == {"invalid": -1.0} and setter.metrics["invalid"] == 1.0
    assert setter.outcome == "ok" and setter.info["actors"] == 1  # the setter's doing: trained


def test_the_band_and_attempts_are_settings() -> None:
    classroom = Classroom("<problem>2 + 2</problem>", ["4", "5"])
    setter, *solvers = roll(classroom, [0], attempts=2, band=(0.5, 0.5))
    assert len(solvers) == 2 and setter.reward == 1.0
    with pytest.raises(ValueError, match="band"):
        SetterSolverEnv(band=(0.8, 0.2))


def test_check_env_passes() -> None:
    assert check_env(SetterSolverEnv()).passed
    assert check_env(SetterSolverEnv(policies={"setter": "random"})).passed
