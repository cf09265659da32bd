"""ToolEnv: tool calls parsed from the turn, run, answered as tool messages, counted in metrics."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import pytest

from envhub.errors import ConfigError, ToolDefinitionError
from envhub.multiturn import ToolEnv
from envhub.rewards.format import tool_call_validity
from envhub.rewards.match import exact_match
from envhub.rewards.rubric import Rubric
from envhub.state import State
from envhub.tools.tool import Injected, tool
from envhub.types import AssistantTurn, ToolCall, assistant, system, tool_message, user

TASKS = [{"question": "What is 2 + 3?", "answer": "5"}]


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def fail() -> str:
    """Always raises."""
    raise RuntimeError("broken tool")


@tool(timeout=0.02)
async def hang() -> str:
    """Never answers in time."""
    await asyncio.sleep(5)
    return "late"


@tool
def lookup(key: str, table: Annotated[dict[str, str], Injected()]) -> str:
    """Look a key up in the episode's table."""
    return table[key]


class Adder(ToolEnv):
    name = "adder"
    tools = (add, fail, hang)

    def default_rubric(self) -> Rubric:
        return Rubric([exact_match(), tool_call_validity()])


def hermes(name: str, arguments: dict[str, Any]) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(arguments)}}}</tool_call>'


def test_tool_schemas() -> None:
    env = Adder(TASKS)
    assert env.tool_schemas == [add.schema, fail.schema, hang.schema]
    assert Adder(TASKS, tools=[]).tool_schemas is None


def test_a_tool_call_gets_a_tool_message_and_the_turn_records_the_parsed_call() -> None:
    env = Adder(TASKS)
    env.reset(seed=0)
    text = "Adding. " + hermes("add", {"a": 2, "b": 3})
    observation, reward_value, terminated, truncated, info = env.step(text)
    assert observation == [tool_message("5", "call_1_1", "add")]
    assert (reward_value, terminated, truncated, info) == (0.0, False, False, {"turn": 1})
    assert env.state is not None
    assert env.state.messages[-2] == assistant(
        text, [ToolCall.make("call_1_1", "add", {"a": 2, "b": 3})]
    )
    assert env.state.messages[-2].content == text  # the raw sampled text is kept


def test_an_answer_without_a_tool_call_ends_the_episode() -> None:
    env = Adder(TASKS)
    env.reset(seed=0)
    env.step(hermes("add", {"a": 2, "b": 3}))
    observation, reward_value, terminated, truncated, info = env.step("It is \\boxed{5}.")
    assert (observation, reward_value, terminated, truncated) == ([], 1.0, True, False)
    assert info["reward_components"] == {"exact_match": 1.0, "tool_validity": 1.0}
    assert info["metrics"] == {"tool_calls": 1}
    assert env.state is not None and env.state.messages[-1] == assistant("It is \\boxed{5}.")


def test_every_kind_of_failure_is_answered_and_counted() -> None:
    env = Adder(TASKS)
    env.reset(seed=0)
    text = (
        hermes("ad", {"a": 1})
        + hermes("add", {"a": 1})
        + hermes("fail", {})
        + "<tool_call>{oops}</tool_call>"
        + hermes("hang", {})
        + hermes("add", {"a": 1, "b": 1})
    )
    observation = env.step(text)[0]
    assert [m.content for m in observation] == [
        "Error: the <tool_call> body is not valid JSON "
        "(Expecting property name enclosed in double quotes at char 1)",
        "Error: there is no tool named 'ad'. Did you mean 'add'? Available tools: add, fail, hang",
        "Error: invalid arguments for add: missing required argument 'b'",
        "Error: fail raised RuntimeError: broken tool",
        "Error: hang did not finish within 0.02 s",
        "2",
    ]
    assert [m.tool_call_id for m in observation] == [
        "call_1_4",
        "call_1_1",
        "call_1_2",
        "call_1_3",
        "call_1_5",
        "call_1_6",
    ]
    _, reward_value, terminated, _, info = env.step("\\boxed{4}")
    assert (reward_value, terminated) == (0.0, True)
    assert info["metrics"] == {
        "tool_calls": 6,
        "tool_errors": 5,
        "tool_error/parse_error": 1,
        "tool_error/unknown_tool": 1,
        "tool_error/invalid_arguments": 1,
        "tool_error/tool_error": 1,
        "tool_error/timeout": 1,
    }
    assert info["reward_components"] == {"exact_match": 0.0, "tool_validity": 1 / 6}


def test_a_turn_of_only_malformed_calls_continues_the_episode() -> None:
    env = Adder(TASKS)
    env.reset(seed=0)
    observation, _, terminated, _, _ = env.step("<tool_call>{")
    assert observation == [
        tool_message("Error: unterminated <tool_call> block (missing </tool_call>)", "call_1_1")
    ]
    assert not terminated
    assert env.state is not None and env.state.messages[-2] == assistant("<tool_call>{")


def test_structured_calls_from_the_server_are_used_as_given() -> None:
    env = Adder(TASKS)
    env.reset(seed=0)
    calls = [
        ToolCall.make("srv-1", "add", {"a": 4, "b": 4}),
        ToolCall.make("srv-2", "add", '{"a": '),
    ]
    observation = env.step(AssistantTurn(message=assistant("", calls)))[0]
    assert observation == [
        tool_message(
            "Error: arguments of 'add' are not valid JSON (Expecting value)", "srv-2", "add"
        ),
        tool_message("8", "srv-1", "add"),
    ]
    assert env.state is not None and env.state.messages[-3] == assistant("", calls)


def test_max_turns_truncates_while_the_model_keeps_calling_tools() -> None:
    env = Adder(TASKS, max_turns=2)
    env.reset(seed=0)
    env.step(hermes("add", {"a": 1, "b": 1}))
    observation, reward_value, terminated, truncated, info = env.step(
        hermes("add", {"a": 2, "b": 2})
    )
    assert observation == [tool_message("4", "call_2_1", "add")]
    assert (reward_value, terminated, truncated, info["stop_reason"]) == (
        0.0,
        False,
        True,
        "max_turns",
    )
    assert info["metrics"] == {"tool_calls": 2}


def test_other_parsers_are_configurable() -> None:
    env = Adder(TASKS, tool_parser="llama3")
    env.reset(seed=0)
    observation = env.step('{"name": "add", "parameters": {"a": 5, "b": 5}}')[0]
    assert observation == [tool_message("10", "call_1_1", "add")]
    # Hermes markup means nothing to the llama3 parser: the turn is an answer.
    env.reset(seed=0)
    assert env.step(hermes("add", {"a": 1, "b": 1}))[2] is True
    with pytest.raises(ConfigError, match="unknown tool-call parser 'xml'"):
        Adder(TASKS, tool_parser="xml")


class Lookup(ToolEnv):
    name = "lookup"
    tools = (lookup,)

    async def setup_state(self, state: State) -> None:
        state.data["table"] = {"k": f"value-{self.np_random.integers(1000)}"}


def test_injected_values_come_from_the_env_state() -> None:
    env = Lookup(TASKS)
    env.reset(seed=1)
    assert env.state is not None
    expected = env.state.data["table"]["k"]
    observation = env.step(hermes("lookup", {"key": "k"}))[0]
    assert observation == [tool_message(expected, "call_1_1", "lookup")]
    assert env.tool_schemas == [lookup.schema]
    assert "table" not in lookup.parameters["properties"]


def test_a_tool_context_without_the_injected_value_is_the_env_authors_error() -> None:
    env = ToolEnv(TASKS, tools=[lookup])
    env.reset(seed=0)
    with pytest.raises(ToolDefinitionError, match=r"tool 'lookup' needs \['table'\] injected"):
        env.step(hermes("lookup", {"key": "k"}))


def test_atruncate_scores_a_tool_episode() -> None:
    env = Adder(TASKS)
    env.reset(seed=0)
    env.step(hermes("add", {"a": 2, "b": 3}))
    reward_value, info = asyncio.run(env.atruncate("max_context"))
    assert reward_value == 0.0
    assert (info["stop_reason"], info["reward_components"], info["metrics"]) == (
        "max_context",
        {"exact_match": 0.0, "tool_validity": 1.0},
        {"tool_calls": 1},
    )


def test_the_prompt_is_the_task() -> None:
    env = Adder(TASKS, system_prompt="Use tools.")
    assert env.reset(seed=0)[0] == [system("Use tools."), user("What is 2 + 3?")]
