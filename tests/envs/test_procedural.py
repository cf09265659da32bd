"""Procedural task sets and the shared arithmetic expressions (and calculator tasks on them)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from envhub.envs.calculator import ProblemSet
from envhub.envs.expressions import evaluate, format_number
from envhub.envs.procedural import ProceduralTasks


def _draw(rng) -> dict:
    return {"question": str(rng.randint(0, 10**9)), "answer": "0"}


def test_tasks_are_a_pure_function_of_name_seed_and_index() -> None:
    tasks = ProceduralTasks("demo", _draw, size=50, seed=3)
    assert len(tasks) == 50
    assert [tasks[i] for i in (7, 0, 7)] == [
        ProceduralTasks("demo", _draw, 50, 3)[i] for i in (7, 0, 7)
    ]
    assert tasks[7] != ProceduralTasks("demo", _draw, 50, 4)[7]
    assert tasks[7] != ProceduralTasks("other", _draw, 50, 3)[7]
    assert len({t["question"] for t in tasks}) == 50


def test_tasks_outside_the_set_raise_index_error() -> None:
    tasks = ProceduralTasks("demo", _draw, size=3)
    with pytest.raises(IndexError):
        tasks[3]
    with pytest.raises(IndexError):
        tasks[-1]
    assert len(list(tasks)) == 3
    with pytest.raises(ValueError):
        ProceduralTasks("demo", _draw, size=0)


def test_evaluate_is_exact_and_refuses_other_syntax() -> None:
    assert evaluate("7 - 2 * (3 + 4)") == -7
    assert evaluate("1 / 3 + 1 / 6") == Fraction(1, 2)
    assert format_number(Fraction(1, 3)) == "0.333333"
    assert format_number(Fraction(-12)) == "-12"
    for bad in ("2 ** 8", "__import__('os')", "x + 1"):
        with pytest.raises(ValueError):
            evaluate(bad)
    with pytest.raises(ZeroDivisionError):
        evaluate("1 / (2 - 2)")


def test_calculator_tasks_are_unchanged_by_the_shared_generator() -> None:
    # Task 0 as generated before the generator moved to envhub.envs.procedural;
    # by hand: 5349 + 6467 - 2754 = 9062; 9062 * 5 * 25 = 1132750; 1132750 * 73 = 82690750.
    assert ProblemSet(1000, 0)[0] == {
        "question": "Compute: 73 * ((5349 + 6467 - 2754) * 5 * 25)",
        "answer": "82690750",
        "info": {"expression": "73 * ((5349 + 6467 - 2754) * 5 * 25)", "level": "medium"},
    }  # the default level, now recorded
