"""The calculator env's dense reward for well-formed tool calls (``tool_call_reward``)."""

from __future__ import annotations

import json

import pytest

import envhub
from envhub.env import as_turn
from envhub.envs.calculator import CalculatorEnv, calculate, reference_policy

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
