"""The calculator env's dense reward for well-formed tool calls (``tool_call_reward``), and its
difficulty levels."""

from __future__ import annotations

import json
import re

import pytest

import envhub
from envhub.checks.checker import check_env
from envhub.env import as_turn
from envhub.envs.calculator import LEVELS, CalculatorEnv, calculate, reference_policy
from envhub.envs.calculator_agent import CalculatorAgentEnv
from envhub.errors import EnvhubError

BROKEN_CALL = '<tool_call>{"name": "calculate", "arguments": {"expression": "1 +"}}</tool_call>'
GOOD_CALL = '<tool_call>{"name": "calculate", "arguments": {"expression": "2 + 3"}}</tool_call>'


def _rewards(env: CalculatorEnv, *turns: str) -> list[float]:
    env.reset(seed=0, options={"task_index": 0})
    return [env.step(turn)[1] for turn in turns]


def test_the_first_turn_whose_calls_all_run_is_paid_once() -> None:
    env = CalculatorEnv(tool_call_reward=0.2)
    assert (env.reward_range, env.pass_threshold, env.audit_floor) == ((0.0, 1.2), 1.0, 0.2)
    # A call that raises earns nothing; the first one that runs earns 0.2; later ones nothing.
    assert _rewards(env, BROKEN_CALL, GOOD_CALL, GOOD_CALL, "no idea") == [0.0, 0.2, 0.0, 0.0]
    assert env.state.reward_components == {"tool_use": 0.2, "correct": 0.0, "tool_validity": 2 / 3}


def test_the_reference_policy_earns_the_tool_reward_and_the_answer() -> None:
    env = CalculatorEnv(tool_call_reward=0.2)
    env.reset(seed=0, options={"task_index": 3})
    rewards = []
    while env.state.stop_reason is None:
        rewards.append(env.step(reference_policy(env.state.messages, env.tool_schemas))[1])
    assert rewards == [0.2, 1.0]
    assert envhub.check_env(CalculatorEnv(tool_call_reward=0.2)).passed
    assert envhub.audit_env(CalculatorEnv(tool_call_reward=0.2)).passed


def test_without_it_nothing_changes() -> None:
    env = CalculatorEnv()
    assert _rewards(env, GOOD_CALL, "no idea") == [0.0, 0.0]
    assert "tool_use" not in env.state.reward_components
    with pytest.raises(ValueError, match="tool_call_reward must be >= 0"):
        CalculatorEnv(tool_call_reward=-0.1)


def test_the_demonstration_is_one_worked_exchange_before_the_question() -> None:
    env = CalculatorEnv(demonstration=True)
    prompt, _ = env.reset(seed=0, options={"task_index": 2})
    assert [m.role for m in prompt] == ["system", "user", "assistant", "tool", "assistant", "user"]
    call = env.parse_turn(env.state, as_turn(prompt[2].content)).calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "calculate",
        {"expression": "(12 + 30) * 5"},
    )
    assert prompt[3].content == calculate("(12 + 30) * 5") == "210"
    assert prompt[-1].content == CalculatorEnv().format_prompt(env.dataset[2])[-1].content
    assert envhub.check_env(CalculatorEnv(demonstration=True)).passed


# -- levels ---------------------------------------------------------------------------------

FIRST = {
    "short": "45 * (62 + 405)",
    "medium": "73 * ((5349 + 6467 - 2754) * 5 * 25)",
    "long": "7760 + 39 * (2866 + (5529 - 6210)) * 66 - 4549",
}
"""The first problem of each level with task seed 0 (medium's as it was before levels)."""


def _operators(expression: str) -> int:
    return sum(expression.count(op) for op in "+-*")


def test_levels_set_how_many_operations_and_how_large_the_numbers() -> None:
    assert CalculatorEnv.levels == ("short", "medium", "long") == tuple(LEVELS)
    assert CalculatorEnv().current_level() == "medium"
    for level, (fewest, most, largest) in {
        "short": (1, 2, 999), "medium": (3, 5, 9999), "long": (6, 8, 9999),
    }.items():  # fmt: skip
        env = CalculatorEnv(level=level, num_tasks=40)
        assert env.current_level() == level
        assert env.dataset[0]["question"] == f"Compute: {FIRST[level]}"
        assert env.dataset[0]["info"] == {"expression": FIRST[level], "level": level}
        expressions = [t["info"]["expression"] for t in env.dataset]
        assert {_operators(e) for e in expressions} == set(range(fewest, most + 1))
        assert max(int(n) for e in expressions for n in re.findall(r"\d+", e)) <= largest
    assert list(CalculatorEnv(num_tasks=5).dataset) == list(
        CalculatorEnv(level="medium", num_tasks=5).dataset
    )
    with pytest.raises(EnvhubError, match="level must be one of short, medium, long, got 'huge'"):
        CalculatorEnv(level="huge")


def test_the_agent_env_plays_the_same_problems_at_each_level() -> None:
    for level in LEVELS:
        agent = CalculatorAgentEnv(level=level, num_tasks=3)
        assert agent.current_level() == level
        assert list(agent.dataset) == list(CalculatorEnv(level=level, num_tasks=3).dataset)


@pytest.mark.parametrize("level", ["short", "long"])
def test_levels_pass_check_env_with_the_reference_at_the_top(level: str) -> None:
    with CalculatorEnv(level=level, num_tasks=5) as env:
        report = check_env(env)
        assert report.passed, report.failures
        assert next(r.detail for r in report.results if r.name == "reference policy at top") == (
            "1.0"
        )
