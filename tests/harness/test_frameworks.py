"""Agent frameworks people already use, run unchanged as harness programs: the OpenAI Agents SDK
(``openai-agents``) here. Their episodes must be recorded token for token, like a native env's."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from envhub.checks.checker import check_env
from envhub.harness import HarnessEnv
from envhub.rewards.rubric import Rubric
from envhub.rollout.runner import RolloutRunner
from envhub.testing import ByteChatTokenizer, ScriptedEngine

from .test_env import TASKS, adder_policy, assert_adder_episode, correct

agents = pytest.importorskip("agents")


def adder_agent(client: Any, model: Any = None) -> Any:
    """An Agents SDK agent with an ``add`` function tool, on ``model`` (a model class; by
    default the chat-completions model)."""

    @agents.function_tool
    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first number.
            b: The second number.
        """
        return a + b

    agents.set_tracing_disabled(True)
    model_class = model or agents.OpenAIChatCompletionsModel
    return agents.Agent(
        name="adder",
        instructions="You add numbers with the add tool.",
        tools=[add],
        model=model_class(model="policy", openai_client=client),
    )


async def agents_sdk_adder(client: Any, prompt: str) -> str:
    """The adder agent on the chat-completions model, run on one task."""
    result = await agents.Runner.run(adder_agent(client), prompt, max_turns=6)
    return str(result.final_output)


def test_an_agents_sdk_tool_episode_is_recorded_token_for_token() -> None:
    engine = ScriptedEngine(adder_policy, ByteChatTokenizer())
    env = lambda: HarnessEnv(agents_sdk_adder, TASKS, rubric=Rubric([correct]))  # noqa: E731
    (traj,) = asyncio.run(RolloutRunner(engine, env).run([0]))
    assert_adder_episode(traj)


def test_a_harness_env_passes_the_env_contract_check() -> None:
    report = check_env(
        HarnessEnv(agents_sdk_adder, TASKS, rubric=Rubric([correct])), raise_on_failure=False
    )
    assert report.failures == []
    assert [r.name for r in report.results][:2] == ["api", "reset"]
