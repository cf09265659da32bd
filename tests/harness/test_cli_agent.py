"""The example CLI agent (``examples/agents/cli_agent.py``) as a harness program: a command that
reads its task on stdin, calls the episode's endpoint and prints its answer. Its episodes are
recorded token for token, and what it prints is what the rubric scores."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from envhub.harness import CommandProgram, HarnessEnv
from envhub.rewards.rubric import Rubric, reward
from envhub.rollout.runner import RolloutRunner
from envhub.state import State
from envhub.testing import ByteChatTokenizer, ScriptedEngine
from envhub.types import Message, Trajectory

from .test_env import assert_token_exact, call

pytest.importorskip("openai")
pytest.importorskip("uvicorn")

SCRIPT = Path(__file__).parents[2] / "examples/agents/cli_agent.py"
TASKS = [{"question": "What is 17 * 23 + 4?", "answer": "395"}]


def load_script() -> ModuleType:
    """The script as a module (it is an example, not part of the installed package)."""
    spec = importlib.util.spec_from_file_location("cli_agent", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@reward
def states_the_answer(state: State, answer: str) -> float:
    """1 when the program printed exactly ``The answer is ANSWER.``"""
    return float(state.data.get("result") == f"The answer is {answer}.")


def calculator_policy(messages: list[Message], tools: Any) -> str:
    """Asks the tool for the task's arithmetic, then repeats what the tool said."""
    results = [m.content for m in messages if m.role == "tool"]
    if not results:
        return "I will calculate. " + call("calculate", expression="17 * 23 + 4")
    return f"The answer is {results[-1]}."


def run_episode(policy: Any, *options: str) -> Trajectory:
    """One episode of the script (with ``options``) on the task, sampled by ``policy``."""
    program = CommandProgram([sys.executable, str(SCRIPT), *options])
    engine = ScriptedEngine(policy, ByteChatTokenizer())
    env = lambda: HarnessEnv(program, TASKS, rubric=Rubric([states_the_answer]))  # noqa: E731
    (traj,) = asyncio.run(RolloutRunner(engine, env).run([0]))
    return traj


def test_the_cli_agent_episode_is_recorded_and_its_stdout_is_scored() -> None:
    traj = run_episode(calculator_policy)
    assert traj.errors == [] and traj.outcome == "ok"
    # The policy never computes: "395" is the script's own calculation, sent back as the tool
    # result, and the printed answer built on it is what the rubric read.
    assert traj.reward == 1.0 and traj.reward_components == {"states_the_answer": 1.0}
    assert [t.tool_calls for t in traj.turns] == [1, 0]
    assert traj.metrics["segments"] == 1 and traj.metrics["prefix_breaks"] == 0
    assert [m.role for m in traj.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert traj.messages[1].content == "What is 17 * 23 + 4?"
    assert [m.content for m in traj.messages if m.role == "tool"] == ["395"]
    assert traj.messages[-1].content == "The answer is 395."
    assert [t["function"]["name"] for t in traj.tools] == ["calculate"]
    assert_token_exact(traj)


def test_a_policy_that_never_answers_stops_at_max_calls_and_scores_zero() -> None:
    def stuck(messages: list[Message], tools: Any) -> str:
        return call("calculate", expression="1 + 1")

    traj = run_episode(stuck, "--max-calls", "2")
    assert traj.errors == [] and traj.outcome == "ok"  # the policy's failure, not the program's
    assert traj.reward == 0.0 and [t.tool_calls for t in traj.turns] == [1, 1]
    assert [m.content for m in traj.messages if m.role == "tool"] == ["2"]


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("17 * 23 + 4", "395"),
        ("12 / 2", "6"),
        ("7 // 2 + 7 % 3", "4"),
        ("-(3 - 5) ** 2", "-4"),
        ("2 ** -1", "0.5"),
        ("1 / 0", "error: division by zero"),
        ("9 ** 9 ** 9", "error: the result is too large"),
        ("10.0 ** 400", "error: the result is too large"),
        ("(-8) ** 0.5", "error: the result is not a real number"),
        ("__import__('os').getcwd()", "error: \"__import__('os').getcwd()\" is not arithmetic"),
        ("x + 1", "error: 'x' is not arithmetic"),
        ("True + 1", "error: 'True' is not arithmetic"),
        ("1 +", "error: not an expression (invalid syntax)"),
    ],
)
def test_calculate_does_arithmetic_only(expression: str, value: str) -> None:
    assert load_script().calculate(expression) == value


def test_a_bad_tool_call_gets_an_error_result_not_a_crash() -> None:
    script = load_script()
    assert script.run_tool("calculate", '{"expression": "2 * 21"}') == "42"
    assert script.run_tool("calculate", "not json").startswith("error: the arguments must be")
    assert script.run_tool("search", "{}") == (
        "error: unknown tool 'search'; the only tool is calculate"
    )
