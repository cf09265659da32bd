"""Run parsed tool calls and turn every outcome, good or bad, into a tool message.

Failure kinds (the episode's metrics count each): ``parse_error`` (bad JSON or shape),
``unknown_tool``, ``invalid_arguments`` (wrong, missing or extra arguments), ``tool_error``
(the tool raised) and ``timeout`` (the tool hung). A tool whose server is gone
(:class:`~envhub.errors.ToolServerUnavailableError`) is none of these: the step raises, and the
runner records an infrastructure failure. A sync tool that times out keeps running in
its worker thread until it returns; only async tools are actually cancelled. Code that must be
killed belongs in a sandbox, not a thread.
"""

from __future__ import annotations

import asyncio
import difflib
import json
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from envhub.errors import ToolDefinitionError, ToolServerUnavailableError
from envhub.tools.parsers import (
    PARSE_ERROR,
    ParsedTurn,
    json_problem,
    loads_untrusted,
    writable,
)
from envhub.tools.tool import Tool, ToolArgumentError
from envhub.types import Message, ToolCall, tool_message

UNKNOWN_TOOL = "unknown_tool"
INVALID_ARGUMENTS = "invalid_arguments"
TOOL_ERROR = "tool_error"
TIMEOUT = "timeout"
ERROR_KINDS = (PARSE_ERROR, UNKNOWN_TOOL, INVALID_ARGUMENTS, TOOL_ERROR, TIMEOUT)


@dataclass(frozen=True)
class ToolOutcome:
    """What one call produced: the message for the model and, if it failed, why."""

    message: Message
    error: str | None = None
    """One of :data:`ERROR_KINDS`, or ``None`` when the tool ran and returned."""
    detail: str = ""


def _format_result(value: Any, max_chars: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if len(text) > max_chars:
        return text[:max_chars] + f"\n... [truncated {len(text) - max_chars} characters]"
    return text


def _tool_message(content: str, call_id: str, name: str | None) -> Message:
    return tool_message(writable(content), call_id, name if name is None else writable(name))


def decode_arguments(call: ToolCall) -> dict[str, Any]:
    """A call's arguments as an object (double-encoded JSON accepted).

    Raises:
        ToolArgumentError: They are not JSON, or not an object (a ``ValueError``).
    """
    text = call.function.arguments or "{}"
    try:
        value = loads_untrusted(text)
        if isinstance(value, str):  # double-encoded: "{\"x\": 1}"
            value = loads_untrusted(value)
    except ValueError as e:
        raise ToolArgumentError(
            f"arguments of {call.name} are not valid JSON ({json_problem(e)})"
        ) from None
    if not isinstance(value, dict):
        raise ToolArgumentError(
            f"arguments of {call.name} must be a JSON object, got {type(value).__name__}"
        )
    return value


class ToolExecutor:
    """Runs the calls of one assistant turn against a set of tools.

    Args:
        tools: The env's tools by name.
        default_timeout: Seconds per call when a tool sets none.
        max_output_chars: Longer results are cut, with a note, so one call cannot flood the context.
    """

    def __init__(
        self, tools: Mapping[str, Tool], default_timeout: float = 30.0, max_output_chars: int = 8000
    ) -> None:
        self.tools = dict(tools)
        self.default_timeout = default_timeout
        self.max_output_chars = max_output_chars

    async def run(
        self, parsed: ParsedTurn, context: dict[str, Any] | None = None
    ) -> list[ToolOutcome]:
        """Outcomes in call order: first the malformed calls, then the well-formed ones."""
        outcomes = [
            self._fail(err.id or "call_invalid", err.name, PARSE_ERROR, err.message)
            for err in parsed.errors
        ]
        for call in parsed.calls:
            outcomes.append(await self._run_one(call, context or {}))
        return outcomes

    async def _run_one(self, call: ToolCall, context: dict[str, Any]) -> ToolOutcome:
        tool = self.tools.get(call.name)
        if tool is None:
            return self._fail(call.id, call.name, UNKNOWN_TOOL, self._unknown_message(call.name))
        try:
            validated = tool.validate(decode_arguments(call))
        except ToolArgumentError as e:
            return self._fail(call.id, call.name, INVALID_ARGUMENTS, str(e))
        timeout = tool.timeout if tool.timeout is not None else self.default_timeout
        # Not wait_for: a TimeoutError the tool raises itself (a socket, a subprocess) is the
        # tool's error, not our timeout, and the two must not be confused.
        task = asyncio.ensure_future(tool.ainvoke(validated, context))
        try:
            done, _ = await asyncio.wait({task}, timeout=timeout)
        except asyncio.CancelledError:  # the step itself was cancelled: take the call with it
            task.cancel()
            raise
        if not done:
            task.cancel()
            return self._fail(
                call.id, call.name, TIMEOUT, f"{call.name} did not finish within {timeout:g} s"
            )
        try:
            text = _format_result(task.result(), self.max_output_chars)
        except (ToolDefinitionError, ToolServerUnavailableError):
            # The env author's bug, or a tool server that is gone: not the model's doing, so
            # the env records it (a lost server as an infrastructure failure).
            raise
        except Exception as e:  # the tool's own bug or refusal: report it to the model
            return self._fail(
                call.id, call.name, TOOL_ERROR, f"{call.name} raised {type(e).__name__}: {e}"
            )
        return ToolOutcome(_tool_message(text, call.id, call.name))

    def _unknown_message(self, name: str) -> str:
        names = sorted(self.tools)
        close = difflib.get_close_matches(name, names, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        return (
            f"there is no tool named {name!r}.{hint} Available tools: {', '.join(names) or 'none'}"
        )

    @staticmethod
    def _fail(call_id: str, name: str | None, kind: str, detail: str) -> ToolOutcome:
        return ToolOutcome(_tool_message(f"Error: {detail}", call_id, name), kind, detail)


def count_calls_run_elsewhere(
    metrics: Counter[str], parsed: ParsedTurn, offered: Collection[str]
) -> int:
    """Count a turn's tool calls in an episode's ``metrics`` when something other than a
    :class:`ToolExecutor` runs them (an adapted framework's env, an agent program), the way
    the executor would: every attempted call in ``tool_calls``; a malformed one, or one naming
    a tool that is not in ``offered``, in ``tool_errors`` and ``tool_error/<kind>``.

    Returns the number of invalid calls (malformed or unknown).
    """
    unknown = sum(call.function.name not in offered for call in parsed.calls)
    metrics["tool_calls"] += parsed.attempted
    metrics["tool_errors"] += len(parsed.errors) + unknown
    for error in parsed.errors:
        metrics[f"tool_error/{error.kind}"] += 1
    if unknown:
        metrics[f"tool_error/{UNKNOWN_TOOL}"] += unknown
    return len(parsed.errors) + unknown
