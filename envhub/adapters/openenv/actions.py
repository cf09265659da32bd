"""From an assistant turn to OpenEnv actions, and from OpenEnv observations to the replies the
model reads, in the adapter's three action modes (see :data:`~.schema.MODES`).

A turn becomes a list of :class:`Attempt`: an action to send to ``step``, or what was wrong with
the reply (``parse_error``, ``unknown_tool``, ``invalid_arguments`` as the tool executor names
them, or ``no_tool_call``), which the env answers itself without stepping the server.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from typing import Any

from envhub.adapters.openenv.schema import observation_text
from envhub.tools.executor import (
    INVALID_ARGUMENTS,
    TIMEOUT,
    TOOL_ERROR,
    UNKNOWN_TOOL,
    decode_arguments,
)
from envhub.tools.mcp import schema_problems
from envhub.tools.parsers import (
    PARSE_ERROR,
    check_openai_calls,
    get_parser,
)
from envhub.types import AssistantTurn, Message, ToolCall, tool_message, user

NO_TOOL_CALL = "no_tool_call"
"""A turn of a tool-mode env that called no tool: nothing could be sent to ``step``."""
MCP_ERROR_KINDS = {
    "tool_not_found": UNKNOWN_TOOL,
    "invalid_args": INVALID_ARGUMENTS,
    "timeout": TIMEOUT,
}
"""OpenEnv's ``ToolErrorType`` -> envhub's failure kind (any other: ``tool_error``)."""


@dataclass(frozen=True)
class Attempt:
    """One action a turn asks for: ``action`` to send, or ``error`` (a failure kind) and
    ``detail`` saying what was wrong. ``call_id``/``name``: the tool call it answers, if any."""

    action: dict[str, Any] | None
    call_id: str | None = None
    name: str | None = None
    error: str | None = None
    detail: str = ""

    def answer(self, text: str) -> Message:
        """The message that answers this attempt: a tool message for a call, else a user one."""
        return user(text) if self.call_id is None else tool_message(text, self.call_id, self.name)


class TextActions:
    """The turn's text is one string field of the action; replies are user messages."""

    mode = "text"
    tool_schemas: list[dict[str, Any]] | None = None

    def __init__(self, field: str, observation_field: str | None, defaults: dict[str, Any]):
        self.field, self.observation_field, self.defaults = field, observation_field, defaults

    def plan(self, turn: AssistantTurn, index: int) -> list[Attempt]:
        """One action: the turn's text in the text field."""
        return [Attempt({**self.defaults, self.field: turn.message.content or ""})]

    def reply(self, attempt: Attempt, observation: dict[str, Any]) -> tuple[Message, str | None]:
        """The observation's text; no failure kind (a text step cannot fail as a call)."""
        return attempt.answer(observation_text(observation, self.observation_field)), None


class ToolActions:
    """The model calls tools: each well-formed call is one action, sent in order.

    Args:
        tools: Name -> ``(description, JSON schema of the arguments)``.
    """

    mode = "tool"

    def __init__(self, tools: dict[str, tuple[str, dict[str, Any]]]) -> None:
        self.tools = tools
        self._parse = get_parser("auto")

    @property
    def tool_schemas(self) -> list[dict[str, Any]]:
        """The tools in OpenAI format."""
        return [
            {
                "type": "function",
                "function": {"name": name, "description": text, "parameters": parameters},
            }
            for name, (text, parameters) in self.tools.items()
        ]

    def plan(self, turn: AssistantTurn, index: int) -> list[Attempt]:
        """The turn's calls (structured ones, else read from its text), each checked against
        its tool's schema; a turn without any is one ``no_tool_call`` failure."""
        message = turn.message
        if message.tool_calls:
            parsed = check_openai_calls(message.content, message.tool_calls)
        else:
            parsed = self._parse(message.content or "", f"call_{index}_")
        attempts = [
            Attempt(None, e.id or "call_invalid", e.name, PARSE_ERROR, e.message)
            for e in parsed.errors
        ]
        attempts += [self._check(call) for call in parsed.calls]
        if not attempts:
            names = ", ".join(self.tools)
            detail = f"this reply called no tool; act by calling one of the tools: {names}"
            attempts.append(Attempt(None, error=NO_TOOL_CALL, detail=detail))
        return attempts

    def action(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """The action a checked call becomes (subclasses say how)."""
        raise NotImplementedError

    def reply(self, attempt: Attempt, observation: dict[str, Any]) -> tuple[Message, str | None]:
        """The tool message answering the call, and its failure kind if the env reports one."""
        raise NotImplementedError

    def _check(self, call: ToolCall) -> Attempt:
        def fail(kind: str, detail: str) -> Attempt:
            return Attempt(None, call.id, call.name, kind, detail)

        if call.name not in self.tools:
            close = difflib.get_close_matches(call.name, list(self.tools), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            names = ", ".join(self.tools)
            return fail(UNKNOWN_TOOL, f"there is no tool named {call.name!r}.{hint} Tools: {names}")
        try:
            arguments = decode_arguments(call)
        except ValueError as e:
            return fail(INVALID_ARGUMENTS, str(e))
        problems = schema_problems(self.tools[call.name][1], arguments)
        if problems:
            return fail(
                INVALID_ARGUMENTS, f"invalid arguments for {call.name}: " + "; ".join(problems)
            )
        return Attempt(self.action(call.name, arguments), call.id, call.name)


class TypedActions(ToolActions):
    """A typed action as one tool whose arguments are the action's fields."""

    def __init__(
        self,
        name: str,
        description: str,
        parameters: dict[str, Any],
        observation_field: str | None,
        defaults: dict[str, Any],
    ) -> None:
        super().__init__({name: (description, parameters)})
        self.observation_field, self.defaults = observation_field, defaults

    def action(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """The call's arguments, over ``action_defaults``."""
        return {**self.defaults, **arguments}

    def reply(self, attempt: Attempt, observation: dict[str, Any]) -> tuple[Message, str | None]:
        """The observation's text (or its fields as JSON) as the call's result."""
        return attempt.answer(observation_text(observation, self.observation_field)), None


class MCPActions(ToolActions):
    """OpenEnv's MCP tools, one envhub tool each, called through ``CallToolAction``."""

    mode = "mcp"

    def action(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """A ``call_tool`` action."""
        return {"type": "call_tool", "tool_name": name, "arguments": arguments}

    def reply(self, attempt: Attempt, observation: dict[str, Any]) -> tuple[Message, str | None]:
        """The tool's result as text, or the error the env reports with its failure kind."""
        error = observation.get("error")
        result = observation.get("result")
        if isinstance(error, dict):
            kind = MCP_ERROR_KINDS.get(str(error.get("error_type")), TOOL_ERROR)
            return attempt.answer(f"Error: {error.get('message', '')}"), kind
        text = mcp_result_text(result)
        if isinstance(result, dict) and result.get("is_error"):
            return attempt.answer(f"Error: {text}"), TOOL_ERROR
        return attempt.answer(text), None


def mcp_result_text(result: Any) -> str:
    """A serialized ``CallToolResult`` as the model reads it: its text blocks, else its
    structured content as JSON, else the whole result as JSON."""
    if isinstance(result, dict):
        blocks = result.get("content") or []
        texts = [
            b["text"] for b in blocks if isinstance(b, dict) and isinstance(b.get("text"), str)
        ]
        if texts:
            return "\n".join(texts)
        if result.get("structured_content") is not None:
            return json.dumps(result["structured_content"], default=str)
    return result if isinstance(result, str) else json.dumps(result, default=str)
