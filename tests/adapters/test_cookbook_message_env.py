"""A tinker cookbook ``MessageEnv`` (its tool-use ``AgentToolMessageEnv``, with a cookbook
``@tool``) as an envhub env: it passes envhub's env checks, its tools reach the model as
OpenAI schemas, a call written as text runs the cookbook's tool, and the rewards are the
cookbook env's own."""

from __future__ import annotations

from typing import Annotated, Any

import pytest

pytest.importorskip("tinker_cookbook")

from tinker_cookbook import renderers  # noqa: E402
from tinker_cookbook.tool_use import tool  # noqa: E402
from tinker_cookbook.tool_use.agent_tool_message_env import AgentToolMessageEnv  # noqa: E402
from tinker_cookbook.tool_use.tools import simple_tool_result  # noqa: E402

from envhub.adapters.cookbook import MessageEnvAsEnv  # noqa: E402
from envhub.checks.checker import check_env  # noqa: E402
from envhub.errors import EnvhubError  # noqa: E402
from envhub.tools.prompt import tool_call_block  # noqa: E402

PROBLEMS = [(12, 30), (7, 8), (100, 23)]


@tool
async def add(a: Annotated[int, "First number"], b: Annotated[int, "Second number"]) -> Any:
    """Add two integers."""
    return simple_tool_result(str(a + b))


def make(index: int) -> AgentToolMessageEnv:
    a, b = PROBLEMS[index]

    async def reward(history: list[renderers.Message]) -> tuple[float, dict[str, float]]:
        answer = renderers.get_text_content(history[-1])
        correct = float(str(a + b) in answer)
        return correct, {"correct": correct}

    question = {"role": "user", "content": f"Use the add tool: what is {a} + {b}?"}
    return AgentToolMessageEnv(tools=[add], initial_messages=[question], max_turns=3,
                               reward_fn=reward)  # fmt: skip


def env() -> MessageEnvAsEnv:
    return MessageEnvAsEnv(make, len(PROBLEMS), tools=[add.to_spec()])


def test_it_passes_envhubs_checks() -> None:
    report = check_env(env(), raise_on_failure=False)
    assert report.passed, str(report)


def test_a_call_in_the_text_runs_the_cookbook_tool_and_it_pays() -> None:
    adapted = env()
    assert adapted.tool_schemas == [{"type": "function", "function": add.to_spec()}]
    prompt, info = adapted.reset(options={"task_index": 2})
    assert info == {"task_index": 2} and [m.role for m in prompt] == ["user"]
    call = tool_call_block("add", {"a": 100, "b": 23})
    replies, reward, terminated, truncated, _ = adapted.step(call)
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert [(m.role, m.content, m.tool_call_id) for m in replies] == [("tool", "123", "call_0_1")]
    replies, reward, terminated, _, info = adapted.step("It is 123.")
    assert replies == [] and reward == 1.0 and terminated
    assert info["metrics"]["correct"] == 1.0 and info["reward_components"] == {"cookbook": 1.0}


def test_a_wrong_task_says_which_exist() -> None:
    with pytest.raises(EnvhubError, match="task_index 3 is outside 0..2"):
        env().reset(options={"task_index": 3})
