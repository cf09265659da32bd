"""The tool executor: every call, good or bad, becomes one tool message and an error kind."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Annotated, Any

import pytest

from envhub.errors import ToolDefinitionError
from envhub.tools.executor import ERROR_KINDS, ToolExecutor, ToolOutcome
from envhub.tools.parsers import PARSE_ERROR, ParsedTurn, ToolCallError
from envhub.tools.tool import Injected, tool
from envhub.types import ToolCall, tool_message


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def divide(a: float, b: float) -> float:
    """Divide."""
    return a / b


@tool
def fetch() -> str:
    """Raises TimeoutError itself, as a socket would."""
    raise TimeoutError("socket timed out")


@tool
def report() -> dict[str, Any]:
    """A structured result."""
    return {"ok": True, "items": [1, 2]}


@tool
def essay() -> str:
    """A long result."""
    return "x" * 30


@tool
def secret(key: Annotated[str, Injected()]) -> str:
    """Needs an injected key."""
    return key


EXECUTOR = ToolExecutor(
    {t.name: t for t in (add, divide, fetch, report, essay, secret)}, max_output_chars=10
)


def run_one(
    name: str, arguments: dict[str, Any] | str, executor: ToolExecutor = EXECUTOR
) -> ToolOutcome:
    outcomes = asyncio.run(executor.run(ParsedTurn("", [ToolCall.make("c1", name, arguments)])))
    assert len(outcomes) == 1
    return outcomes[0]


def failed(kind: str, detail: str, name: str | None, call_id: str = "c1") -> ToolOutcome:
    return ToolOutcome(tool_message(f"Error: {detail}", call_id, name), kind, detail)


def test_error_kinds() -> None:
    assert ERROR_KINDS == (
        "parse_error",
        "unknown_tool",
        "invalid_arguments",
        "tool_error",
        "timeout",
    )


def test_successful_call() -> None:
    assert run_one("add", {"a": 2, "b": 3}) == ToolOutcome(tool_message("5", "c1", "add"))


def test_structured_results_are_json() -> None:
    executor = ToolExecutor({"report": report})
    assert run_one("report", {}, executor).message.content == '{"ok": true, "items": [1, 2]}'


def test_unknown_tool_suggests_the_nearest_name() -> None:
    detail = (
        "there is no tool named 'ad'. Did you mean 'add'? "
        "Available tools: add, divide, essay, fetch, report, secret"
    )
    assert run_one("ad", {"a": 1}) == failed("unknown_tool", detail, "ad")


def test_unknown_tool_without_a_close_name_and_without_tools() -> None:
    detail = (
        "there is no tool named 'zzz'. Available tools: add, divide, essay, fetch, report, secret"
    )
    assert run_one("zzz", {}) == failed("unknown_tool", detail, "zzz")
    assert (
        run_one("add", {}, ToolExecutor({})).detail
        == "there is no tool named 'add'. Available tools: none"
    )


@pytest.mark.parametrize(
    ("arguments", "detail"),
    [
        ({"a": 1}, "invalid arguments for add: missing required argument 'b'"),
        ({"a": 1, "b": 2, "c": 3}, "invalid arguments for add: unexpected argument 'c'"),
        ("[1, 2]", "arguments of add must be a JSON object, got list"),
        (
            "{bad",
            "arguments of add are not valid JSON "
            "(Expecting property name enclosed in double quotes)",
        ),
        ('"not json inside"', "arguments of add are not valid JSON (Expecting value)"),
    ],
)
def test_invalid_arguments(arguments: dict[str, Any] | str, detail: str) -> None:
    assert run_one("add", arguments) == failed("invalid_arguments", detail, "add")


def test_double_encoded_argument_json_is_decoded() -> None:
    assert run_one("add", '"{\\"a\\": 1, \\"b\\": 2}"') == ToolOutcome(
        tool_message("3", "c1", "add")
    )


def test_empty_arguments_text_means_no_arguments() -> None:
    assert run_one("report", "", ToolExecutor({"report": report})).error is None


def test_a_tool_that_raises_is_reported_to_the_model() -> None:
    detail = "divide raised ZeroDivisionError: float division by zero"
    assert run_one("divide", {"a": 1, "b": 0}) == failed("tool_error", detail, "divide")


def test_a_timeout_the_tool_raises_itself_is_a_tool_error_not_our_timeout() -> None:
    detail = "fetch raised TimeoutError: socket timed out"
    assert run_one("fetch", {}) == failed("tool_error", detail, "fetch")


def test_long_output_is_truncated_with_a_note() -> None:
    assert run_one("essay", {}).message.content == "xxxxxxxxxx\n... [truncated 20 characters]"


def test_parse_errors_come_first_then_calls_in_order() -> None:
    parsed = ParsedTurn(
        "",
        [ToolCall.make("call_1_2", "add", {"a": 1, "b": 1})],
        [
            ToolCallError(PARSE_ERROR, "bad JSON", "{", "call_1_1"),
            ToolCallError(PARSE_ERROR, "no id", ""),
        ],
    )
    outcomes = asyncio.run(EXECUTOR.run(parsed))
    assert outcomes == [
        failed("parse_error", "bad JSON", None, "call_1_1"),
        failed("parse_error", "no id", None, "call_invalid"),
        ToolOutcome(tool_message("2", "call_1_2", "add")),
    ]


def test_a_missing_injected_value_propagates_as_the_env_authors_error() -> None:
    with pytest.raises(ToolDefinitionError, match=r"tool 'secret' needs \['key'\] injected"):
        run_one("secret", {})
    outcome = asyncio.run(
        EXECUTOR.run(ParsedTurn("", [ToolCall.make("c1", "secret", {})]), {"key": "k"})
    )
    assert outcome == [ToolOutcome(tool_message("k", "c1", "secret"))]


def test_a_sync_tool_hanging_past_its_timeout_returns_promptly() -> None:
    release = threading.Event()

    @tool(timeout=0.1)
    def hang() -> str:
        """Blocks until released."""
        release.wait(60)
        return "late"

    async def main() -> tuple[list[ToolOutcome], float]:
        started = time.perf_counter()
        try:
            return await ToolExecutor({"hang": hang}).run(
                ParsedTurn("", [ToolCall.make("c1", "hang", {})])
            ), time.perf_counter() - started
        finally:
            release.set()  # let the worker thread finish so the loop can shut down

    outcomes, elapsed = asyncio.run(main())
    assert outcomes == [failed("timeout", "hang did not finish within 0.1 s", "hang")]
    assert elapsed < 10.0  # ~0.1 s; waiting for the tool would take 60 s


def cancellable_sleeper(cancelled: list[bool]):
    """An async tool that sleeps 60 s and notes in ``cancelled`` when it is cancelled."""

    @tool
    async def sleepy() -> str:
        """Sleeps."""
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return "late"

    return sleepy


def test_an_async_tool_past_its_timeout_is_cancelled() -> None:
    cancelled: list[bool] = []
    sleepy = cancellable_sleeper(cancelled)

    async def main() -> tuple[list[ToolOutcome], float]:
        started = time.perf_counter()
        outcomes = await ToolExecutor({"sleepy": sleepy}, default_timeout=0.05).run(
            ParsedTurn("", [ToolCall.make("c1", "sleepy", {})])
        )
        elapsed = time.perf_counter() - started
        await asyncio.sleep(0)  # let the cancellation be delivered
        return outcomes, elapsed

    outcomes, elapsed = asyncio.run(main())
    assert outcomes == [failed("timeout", "sleepy did not finish within 0.05 s", "sleepy")]
    assert elapsed < 10.0  # ~0.05 s; waiting for the tool would take 60 s
    assert cancelled == [True]


def test_cancelling_the_turn_cancels_the_running_tool() -> None:
    cancelled: list[bool] = []
    sleepy = cancellable_sleeper(cancelled)

    async def main() -> None:
        run = ToolExecutor({"sleepy": sleepy}).run(
            ParsedTurn("", [ToolCall.make("c1", "sleepy", {})])
        )
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(run, 0.05)
        await asyncio.sleep(0)

    asyncio.run(main())
    assert cancelled == [True]
