"""A pydantic-ai agent (``pydantic-ai-slim[openai]``), run unchanged as a harness program: its
episodes are recorded token for token, its plain and streamed runs alike.

pydantic-ai re-sends its history from its own parsed messages: the endpoint replied with the
arguments ``{"a": 2, "b": 3}`` and gets ``{"a":2,"b":3}`` back (re-serialised without spaces).
The endpoint must still read each call as the same conversation, continued (no prefix break).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from envhub.harness import HarnessEnv
from envhub.rewards.rubric import Rubric
from envhub.rollout.runner import RolloutRunner
from envhub.testing import ByteChatTokenizer, ScriptedEngine
from envhub.types import Trajectory

from .test_env import TASKS, adder_policy, assert_adder_episode, correct

pytest.importorskip("pydantic_ai")
pytest.importorskip("uvicorn")

from pydantic_ai import Agent, AgentRunResultEvent  # noqa: E402
from pydantic_ai.models.openai import OpenAIChatModel  # noqa: E402
from pydantic_ai.providers.openai import OpenAIProvider  # noqa: E402


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def adder_agent(base_url: str, api_key: str) -> Agent[None, str]:
    """A pydantic-ai agent on the chat-completions model, pointed at the episode's endpoint."""
    provider = OpenAIProvider(base_url=base_url, api_key=api_key)
    return Agent(
        OpenAIChatModel("policy", provider=provider),
        instructions="You add numbers with the add tool.",
        tools=[add],
    )


async def pydantic_ai_adder(base_url: str, api_key: str, prompt: str) -> str:
    """The agent's run to its output (one non-streaming request per model call)."""
    result = await adder_agent(base_url, api_key).run(prompt)
    return result.output


async def streaming_pydantic_ai_adder(base_url: str, api_key: str, prompt: str) -> str:
    """The same agent, its model calls streamed (``stream=True``) through to its output.

    ``run_stream_events`` runs the whole tool loop; ``run_stream`` would not serve here, since it
    takes the first text it streams ("Let me add.") as the final output and stops there.
    """
    async with adder_agent(base_url, api_key).run_stream_events(prompt) as events:
        async for event in events:
            if isinstance(event, AgentRunResultEvent):
                return event.result.output
    raise AssertionError("the run ended without a result")


def run_episode(program: Any) -> Trajectory:
    """One episode of ``program`` on the adder task, sampled by the scripted adder policy."""
    engine = ScriptedEngine(adder_policy, ByteChatTokenizer())
    env = lambda: HarnessEnv(program, TASKS, rubric=Rubric([correct]))  # noqa: E731
    (traj,) = asyncio.run(RolloutRunner(engine, env).run([0]))
    return traj


def test_a_pydantic_ai_tool_episode_is_recorded_token_for_token() -> None:
    traj = run_episode(pydantic_ai_adder)
    assert_adder_episode(traj)
    assert traj.messages[-1].content == "The answer is 9."


def test_a_streamed_pydantic_ai_episode_records_the_same_tokens() -> None:
    plain = run_episode(pydantic_ai_adder)
    streamed = run_episode(streaming_pydantic_ai_adder)
    assert_adder_episode(streamed)
    assert streamed.token_ids == plain.token_ids and streamed.loss_mask == plain.loss_mask
    assert streamed.messages == plain.messages
