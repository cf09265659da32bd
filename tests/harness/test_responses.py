"""The Responses API on the recording endpoint: the OpenAI Agents SDK's default model
(``OpenAIResponsesModel``) and ``client.responses.create`` run against it unchanged, and their
episodes are recorded token for token, like a chat-completions harness's."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from envhub.harness import HarnessEnv
from envhub.harness.responses import read_responses_request
from envhub.harness.wire import WireError
from envhub.inference.base import SamplingParams
from envhub.rewards.rubric import Rubric
from envhub.rollout.runner import RolloutRunner
from envhub.testing import ByteChatTokenizer, ScriptedEngine
from envhub.types import Message, ToolCall, Trajectory

from .test_env import TASKS, adder_policy, assert_adder_episode, call, correct
from .test_frameworks import adder_agent, agents_sdk_adder

openai = pytest.importorskip("openai")
agents = pytest.importorskip("agents")
pytest.importorskip("uvicorn")

ADD = {
    "type": "function",
    "name": "add",
    "description": "Add two integers.",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
}


def responses_agent(client: Any) -> Any:
    """The adder agent of ``test_frameworks`` on the SDK's default (Responses) model."""
    return adder_agent(client, agents.OpenAIResponsesModel)


async def responses_adder(client: Any, prompt: str) -> str:
    result = await agents.Runner.run(responses_agent(client), prompt, max_turns=6)
    return str(result.final_output)


async def streaming_responses_adder(client: Any, prompt: str) -> str:
    result = agents.Runner.run_streamed(responses_agent(client), prompt, max_turns=6)
    async for _ in result.stream_events():
        pass
    return str(result.final_output)


def rollout(program: Any, policy: Any = adder_policy, **runner_args: Any) -> Trajectory:
    engine = ScriptedEngine(policy, ByteChatTokenizer())
    env = lambda: HarnessEnv(program, TASKS, rubric=Rubric([correct]))  # noqa: E731
    (traj,) = asyncio.run(RolloutRunner(engine, env, **runner_args).run([0]))
    return traj


def test_an_agents_sdk_episode_on_the_responses_api_is_recorded_token_for_token() -> None:
    traj = rollout(responses_adder)
    # The SDK re-sends each reply as a message item and call items: read back as one turn, and
    # its `instructions` as the system message.
    assert_adder_episode(traj)


def test_streaming_and_chat_completions_record_the_same_episode_as_responses() -> None:
    plain = rollout(responses_adder)
    streamed = rollout(streaming_responses_adder)
    chat = rollout(agents_sdk_adder)  # the same agent on OpenAIChatCompletionsModel
    for other in (streamed, chat):
        assert other.outcome == "ok" and other.reward == 1.0
        assert other.metrics["prefix_breaks"] == 0 and other.segments == []
        assert other.token_ids == plain.token_ids and other.loss_mask == plain.loss_mask
        assert other.messages == plain.messages and other.tools == plain.tools


def tool_then_text(messages: list[Message], tools: Any) -> str:
    """Calls add(2, 3) when it has no result yet, then says the result."""
    results = [m.content for m in messages if m.role == "tool"]
    return f"It is {results[0]}." if results else "Sure. " + call("add", a=2, b=3)


async def read_stream(stream: Any) -> tuple[list[str], Any]:
    """The event types of a ``responses.create(stream=True)`` stream, and its final response."""
    types, final = [], None
    async for event in stream:
        types.append(event.type)
        assert event.sequence_number == len(types) - 1
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response
    return types, final


CALL_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.output_item.added",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.output_item.done",
    "response.completed",
]
TEXT_EVENTS = CALL_EVENTS[:8] + ["response.completed"]


@pytest.mark.parametrize("mode", ["plain", "stream", "helper"])
def test_the_openai_sdk_parses_text_and_tool_call_replies(mode: str) -> None:
    """``create``, ``create(stream=True)``, and the ``responses.stream`` helper (which checks
    that the events build the response they end with)."""
    seen: list[tuple[list[str] | None, Any]] = []

    async def create(client: Any, history: list[Any]) -> Any:
        kwargs = {"model": "m", "instructions": "Use add.", "input": history, "tools": [ADD]}
        if mode == "plain":
            seen.append((None, await client.responses.create(**kwargs)))
        elif mode == "stream":
            seen.append(await read_stream(await client.responses.create(**kwargs, stream=True)))
        else:
            async with client.responses.stream(**kwargs) as stream:
                types = [event.type async for event in stream]
                seen.append((types, await stream.get_final_response()))
        return seen[-1][1]

    async def program(client: Any, prompt: str) -> str:
        history: list[Any] = [{"role": "user", "content": prompt}]
        first = await create(client, history)
        history += [item.model_dump(exclude_none=True) for item in first.output]
        (tool_call,) = [item for item in first.output if item.type == "function_call"]
        history.append(
            {"type": "function_call_output", "call_id": tool_call.call_id, "output": "5"}
        )
        return (await create(client, history)).output_text

    traj = rollout(program, tool_then_text)
    assert traj.outcome == "ok" and traj.errors == []
    assert traj.metrics["prefix_breaks"] == 0 and [t.tool_calls for t in traj.turns] == [1, 0]
    (types1, first), (types2, second) = seen
    expected = (None, None) if mode == "plain" else (CALL_EVENTS, TEXT_EVENTS)
    assert (types1, types2) == expected
    assert isinstance(first, openai.types.responses.Response)
    assert first.id.startswith("resp_") and first.object == "response"
    assert first.status == "completed" and first.incomplete_details is None
    message, function_call = first.output
    assert isinstance(message, openai.types.responses.ResponseOutputMessage)
    assert message.role == "assistant" and message.status == "completed"
    assert [(p.type, p.text) for p in message.content] == [("output_text", "Sure.")]
    assert isinstance(function_call, openai.types.responses.ResponseFunctionToolCall)
    assert (function_call.name, json.loads(function_call.arguments)) == ("add", {"a": 2, "b": 3})
    assert function_call.call_id == "call_1_1" and function_call.status == "completed"
    assert [t.name for t in first.tools] == ["add"] and first.tool_choice == "auto"
    assert first.output_text == "Sure."
    assert second.status == "completed" and [item.type for item in second.output] == ["message"]
    assert second.output_text == "It is 5."
    tokens = ByteChatTokenizer().encode("It is 5.") + [ByteChatTokenizer().eos_token_id]
    assert second.usage.output_tokens == second.usage.total_tokens == len(tokens)
    assert second.usage.input_tokens == 0
    # What the program re-sent was read back as the chat conversation the env recorded.
    assert [m.role for m in traj.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert traj.messages[3].tool_call_id == "call_1_1"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_turn_cut_by_the_token_limit_is_an_incomplete_response(stream: bool) -> None:
    seen: list[Any] = []

    async def program(client: Any, prompt: str) -> str:
        response = await client.responses.create(model="m", input=prompt, stream=stream)
        if stream:
            types, response = await read_stream(response)
            assert types[-1] == "response.incomplete"
        seen.append(response)
        return response.output_text

    traj = rollout(program, lambda m, t: "a long answer", sampling=SamplingParams(max_tokens=4))
    (response,) = seen
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == "a lo" and response.output[0].status == "incomplete"
    assert traj.outcome == "ok" and traj.turns[0].finish_reason == "length"


def test_previous_response_id_is_refused_and_recorded_on_the_episode() -> None:
    seen: list[str] = []

    async def program(client: Any, prompt: str) -> str:
        try:
            await client.responses.create(model="m", input=prompt, previous_response_id="resp_7")
        except openai.BadRequestError as e:
            seen.append(e.message)
        response = await client.responses.create(model="m", input=prompt)
        seen.append(response.output_text)
        return response.output_text

    traj = rollout(program, lambda m, t: "9")
    message, answer = seen
    assert "previous_response_id='resp_7'" in message and "whole history" in message
    assert answer == "9" and traj.outcome == "env_failure" and len(traj.turns) == 1
    (error,) = traj.errors
    assert (error.stage, error.type) == ("harness.request", "bad_request")
    assert error.message.startswith("previous_response_id='resp_7'")


# -- reading requests ---------------------------------------------------------------------------


def test_items_are_read_as_chat_messages() -> None:
    request = read_responses_request(
        {
            "instructions": "Be brief.",
            "input": [
                {"role": "developer", "content": [{"type": "input_text", "text": "Rules."}]},
                {"type": "message", "role": "user", "content": "Hi"},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a":1}'},
                {"type": "function_call", "call_id": "c2", "name": "add", "arguments": {"a": 2}},
                {"type": "function_call_output", "call_id": "c1", "output": "1"},
                {
                    "type": "function_call_output",
                    "call_id": "c2",
                    "output": [{"type": "input_text", "text": "2"}],
                },
            ],
            "tools": [{**ADD, "strict": True}],
            "temperature": 0.3,
            "max_output_tokens": 99,
            "tool_choice": "required",
            "store": True,
        }
    )
    assert request.messages == [
        Message(role="system", content="Be brief."),
        Message(role="system", content="Rules."),
        Message(role="user", content="Hi"),
        Message(
            role="assistant",
            content=None,
            tool_calls=(
                ToolCall.make("c1", "add", '{"a":1}'),
                ToolCall.make("c2", "add", '{"a": 2}'),
            ),
        ),
        Message(role="tool", content="1", tool_call_id="c1"),
        Message(role="tool", content="2", tool_call_id="c2"),
    ]
    assert request.tools == [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Add two integers.",
                "parameters": ADD["parameters"],
                "strict": True,
            },
        }
    ]
    assert request.overridden == ["temperature", "max_output_tokens", "tool_choice"]
    assert read_responses_request({"input": "Hi"}).messages == [Message(role="user", content="Hi")]


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"input": "Hi", "previous_response_id": "resp_1"}, "previous_response_id='resp_1'"),
        ({"input": "Hi", "conversation": "conv_1"}, "conversation='conv_1'"),
        ({"input": "Hi", "top_p": 0.5}, "top_p=0.5"),
        ({"input": []}, "`input` must be a non-empty"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "type 'item_reference'"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
            "'input_image' is not supported",
        ),
        ({"input": "Hi", "tools": [{"type": "web_search"}]}, "only function tools"),
    ],
)
def test_requests_the_endpoint_cannot_serve_are_refused(body: dict[str, Any], said: str) -> None:
    with pytest.raises(WireError) as caught:
        read_responses_request(body)
    assert said in str(caught.value)


def test_an_agent_that_refuses_a_turn_cut_by_the_token_limit_fails_as_the_policy() -> None:
    # The Agents SDK raises ModelBehaviorError on an incomplete response: the policy ran past
    # its token budget, so the episode is the policy's failure, scored and trained.
    traj = rollout(responses_adder, lambda m, t: "x" * 50, sampling=SamplingParams(max_tokens=5))
    assert traj.errors == [] and traj.outcome == "policy_failure"
    assert traj.stop_reason == "program_gave_up" and [t.finish_reason for t in traj.turns] == [
        "length"
    ]
    assert sum(traj.loss_mask) == 5
