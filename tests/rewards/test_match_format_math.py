"""Answer extraction, exact match, format rewards and math verification."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from envhub.rewards.format import has_answer, tool_call_validity, xml_tags
from envhub.rewards.match import exact_match, extract_answer, normalize, number_answer, parse_number
from envhub.rewards.math import math_answer, verify_math
from envhub.rewards.rubric import Rubric
from envhub.state import State
from envhub.types import assistant, user


def make_state(response: str, answer: Any = None, **metrics: int) -> State:
    prompt = [user("q")]
    return State(
        task={"question": "q", "answer": answer},
        task_index=0,
        prompt=prompt,
        messages=[*prompt, assistant(response)],
        metrics=Counter(metrics),
    )


def score(rubric: Rubric, state: State) -> dict[str, float]:
    result = asyncio.run(rubric.score(state))
    assert result.errors == []
    return result.components


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{a} and finally \\boxed{b}", "b"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}"),
        ("\\boxed{ 7 }", "7"),
        ("\\boxed{unclosed", None),
        ("<answer> Paris </answer>", "Paris"),
        ("<answer>a</answer> then <answer>b</answer>", "b"),
        ("<answer>tag</answer> \\boxed{box}", "box"),
        ("Reasoning...\nFinal answer: 7\nThanks", "7"),
        ("ANSWER： 12", "12"),
        ("Answer: 5.", "5."),
        ("the answer is 4", None),
        ("", None),
    ],
)
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("  Hello   World. ", "hello world"),
        ('"Paris"', "paris"),
        ("ＡＢＣ", "abc"),
        ("Straße", "strasse"),
        ("...", ""),
    ],
)
def test_normalize(text: str, expected: str) -> None:
    assert normalize(text) == expected


@pytest.mark.parametrize(
    ("response", "answer", "extract", "expected"),
    [
        ("The capital is \\boxed{Paris}.", "paris", True, 1.0),
        ("The capital is \\boxed{Lyon}.", "Paris", True, 0.0),
        ("Paris", "Paris", True, 0.0),  # nothing to extract
        ("  PARIS. ", "Paris", False, 1.0),
        ("Answer: 42", 42, True, 1.0),
        ("Answer: 42", None, True, 0.0),
    ],
)
def test_exact_match(response: str, answer: Any, extract: bool, expected: float) -> None:
    rubric = Rubric([exact_match(extract=extract)])
    assert score(rubric, make_state(response, answer)) == {"exact_match": expected}


def test_has_answer_and_xml_tags() -> None:
    rubric = Rubric([has_answer(), xml_tags(["think", "answer"])])
    assert rubric.weights == {"format": 0.1, "xml_format": 0.1}
    assert score(rubric, make_state("<think>a</think><answer>b</answer>")) == {
        "format": 1.0,
        "xml_format": 1.0,
    }
    assert score(rubric, make_state("<think>a</think><think>b</think><answer>c")) == {
        "format": 0.0,
        "xml_format": 0.0,
    }
    assert score(rubric, make_state("<think>a</think> \\boxed{1}")) == {
        "format": 1.0,
        "xml_format": 0.5,
    }


@pytest.mark.parametrize(
    ("metrics", "expected"),
    [({}, 1.0), ({"tool_calls": 4}, 1.0), ({"tool_calls": 4, "tool_errors": 1}, 0.75)],
)
def test_tool_call_validity(metrics: dict[str, int], expected: float) -> None:
    rubric = Rubric([tool_call_validity()])
    assert rubric.weights == {"tool_validity": 0.0}
    assert score(rubric, make_state("x", **metrics)) == {"tool_validity": expected}


@pytest.mark.parametrize(
    ("response", "answer", "expected"),
    [
        ("So the result is \\boxed{42}.", "42", True),
        ("\\boxed{\\frac{1}{2}}", "0.5", True),
        ("\\boxed{1/2}", "\\frac{1}{2}", True),
        ("\\boxed{0.5}", "$\\frac{1}{2}$", True),
        ("The answer is 1,234", "1234", True),
        ("Answer: 1,000,000", "1000000", True),
        ("\\boxed{42}", 42, True),
        ("\\boxed{41}", "42", False),
        ("\\boxed{-42}", "42", False),
        ("", "42", False),
        ("\\boxed{42}", None, False),
        ("no number here", "42", False),
    ],
)
def test_verify_math(response: str, answer: Any, expected: bool) -> None:
    assert verify_math(response, answer) is expected


def test_math_answer_reward() -> None:
    rubric = Rubric([math_answer(weight=2.0)])
    result = asyncio.run(rubric.score(make_state("\\boxed{\\frac{3}{4}}", "0.75")))
    assert (result.total, result.components, result.errors) == (2.0, {"correct": 1.0}, [])
    assert score(rubric, make_state("\\boxed{3}", "0.75")) == {"correct": 0.0}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("42", 42.0),
        ("-3.5", -3.5),
        ("1,000", 1000.0),
        ("$7$", 7.0),
        ("55.", 55.0),
        ("−4", -4.0),
        ("99 + 68", None),
        ("1,00", None),
        ("\\frac{1}{2}", None),
        ("x", None),
        ("", None),
    ],
)
def test_parse_number_accepts_one_literal_only(text: str, expected: float | None) -> None:
    assert parse_number(text) == expected


@pytest.mark.parametrize(
    ("response", "answer", "expected"),
    [
        ("so \\boxed{167}, then 3", "167", 1.0),  # the boxed answer, not the last number
        ("34 + 21 = 55.", "55", 1.0),  # no boxed answer: the last number
        ("\\boxed{99 + 68}", "167", 0.0),  # an expression is not an answer
        ("Answer: 1,000", "1000", 1.0),
        ("\\boxed{0.30000000000000004}", "0.3", 1.0),
        ("no number here", "3", 0.0),
        ("\\boxed{3}", None, 0.0),
    ],
)
def test_number_answer(response: str, answer: Any, expected: float) -> None:
    assert score(Rubric([number_answer()]), make_state(response, answer)) == {"correct": expected}
