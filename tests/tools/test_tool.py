"""``@tool``: schemas from signatures and docstrings, argument validation, injected arguments."""

from __future__ import annotations

import asyncio
import threading
from typing import Annotated, Any, Literal, Optional

import pytest
from pydantic import BaseModel

from envhub.errors import ToolDefinitionError
from envhub.tools.tool import Injected, Tool, ToolArgumentError, make_tool, tool


class Point(BaseModel):
    x: int
    y: float = 0.0


@tool
def search(
    query: str,
    limit: int = 5,
    lang: Optional[str] = None,  # noqa: UP045 - Optional is part of what is tested
    tags: list[str] = [],  # noqa: B006 - the default is data for the schema, never mutated
    mode: Literal["fast", "exact"] = "fast",
    origin: Point | None = None,
    title: str = "t",
) -> str:
    """Search the corpus.

    Results are ranked by relevance.

    Args:
        query: What to look for.
        limit: Most results to return.
        origin: Where to search from.
    """
    return query


def test_schema_comes_from_signature_and_docstring() -> None:
    assert search.schema == {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the corpus.\n\nResults are ranked by relevance.",
            "parameters": {
                "$defs": {
                    "Point": {
                        "properties": {
                            "x": {"type": "integer"},
                            "y": {"default": 0.0, "type": "number"},
                        },
                        "required": ["x"],
                        "type": "object",
                    }
                },
                "additionalProperties": False,
                "properties": {
                    "query": {"description": "What to look for.", "type": "string"},
                    "limit": {
                        "default": 5,
                        "description": "Most results to return.",
                        "type": "integer",
                    },
                    "lang": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
                    "tags": {"default": [], "items": {"type": "string"}, "type": "array"},
                    "mode": {"default": "fast", "enum": ["fast", "exact"], "type": "string"},
                    "origin": {
                        "anyOf": [{"$ref": "#/$defs/Point"}, {"type": "null"}],
                        "default": None,
                        "description": "Where to search from.",
                    },
                    # a parameter named "title" survives the removal of pydantic's title keys
                    "title": {"default": "t", "type": "string"},
                },
                "required": ["query"],
                "type": "object",
            },
        },
    }


def test_name_and_description_can_be_given() -> None:
    @tool(name="lookup-v2", description="Look it up.", timeout=3.0)
    def lookup(key: str) -> str:
        """Ignored docstring."""
        return key

    assert isinstance(lookup, Tool)
    assert (lookup.name, lookup.description, lookup.timeout) == ("lookup-v2", "Look it up.", 3.0)
    assert lookup.schema["function"]["name"] == "lookup-v2"


def test_function_without_docstring_is_described_by_its_name() -> None:
    def ping(n: int) -> int:
        return n

    assert make_tool(ping).schema == {
        "type": "function",
        "function": {
            "name": "ping",
            "description": "ping",
            "parameters": {
                "additionalProperties": False,
                "properties": {"n": {"type": "integer"}},
                "required": ["n"],
                "type": "object",
            },
        },
    }


def test_make_tool_returns_a_tool_unchanged_and_call_reaches_the_function() -> None:
    assert make_tool(search) is search
    assert search("direct call") == "direct call"


def test_validate_fills_defaults_and_converts_nested_models() -> None:
    values = search.validate({"query": "q", "origin": {"x": 1}, "tags": ["a"]})
    assert values == {
        "query": "q",
        "limit": 5,
        "lang": None,
        "tags": ["a"],
        "mode": "fast",
        "origin": Point(x=1, y=0.0),
        "title": "t",
    }


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, "invalid arguments for search: missing required argument 'query'"),
        ({"query": "q", "page": 2}, "invalid arguments for search: unexpected argument 'page'"),
        (
            {"query": "q", "limit": "many"},
            "invalid arguments for search: argument 'limit': Input should be a valid integer, "
            'unable to parse string as an integer (got "many")',
        ),
        (
            {"query": "q", "mode": "slow"},
            "invalid arguments for search: argument 'mode': "
            "Input should be 'fast' or 'exact' (got \"slow\")",
        ),
        (
            {"query": "q", "origin": {"x": "left"}},
            "invalid arguments for search: argument 'origin.x': Input should be a valid integer, "
            'unable to parse string as an integer (got "left")',
        ),
        (
            {"limit": 1.5, "extra": 1},
            "invalid arguments for search: missing required argument 'query'; "
            "argument 'limit': Input should be a valid integer, "
            "got a number with a fractional part (got 1.5); "
            "unexpected argument 'extra'",
        ),
        (["q"], "arguments must be a JSON object, got list"),
    ],
)
def test_invalid_arguments_get_exact_messages(arguments: Any, message: str) -> None:
    with pytest.raises(ToolArgumentError) as info:
        search.validate(arguments)
    assert str(info.value) == message


@tool
def read_row(
    row: int, db: Annotated[dict, Injected("database")], state: Annotated[Any, Injected]
) -> str:
    """Read one row.

    Args:
        row: Row number.
        db: Never shown to the model.
    """
    return f"{db[row]} (turn {state['turn']})"


def test_injected_parameters_are_hidden_and_filled_from_the_context() -> None:
    assert read_row.parameters == {
        "additionalProperties": False,
        "properties": {"row": {"description": "Row number.", "type": "integer"}},
        "required": ["row"],
        "type": "object",
    }
    assert read_row.injected == {"db": "database", "state": "state"}
    context = {"database": {3: "three"}, "state": {"turn": 2}, "other": 0}
    assert asyncio.run(read_row.acall({"row": 3}, context)) == "three (turn 2)"


def test_the_model_cannot_pass_an_injected_argument() -> None:
    with pytest.raises(ToolArgumentError, match="unexpected argument 'db'"):
        read_row.validate({"row": 1, "db": {}})


def test_missing_injected_value_is_the_env_authors_error() -> None:
    with pytest.raises(ToolDefinitionError) as info:
        asyncio.run(read_row.acall({"row": 3}, {"state": {}}))
    assert str(info.value) == (
        "tool 'read_row' needs ['database'] injected, "
        "but the env's tool context has only ['state']; "
        "return them from the env's `tool_context()`"
    )


def test_sync_tools_run_in_a_worker_thread_unless_inline() -> None:
    def where() -> int:
        return threading.get_ident()

    async def main() -> tuple[int, int, int]:
        threaded = await make_tool(where).acall({})
        inline = await make_tool(where, inline=True).acall({})
        return threading.get_ident(), threaded, inline

    loop_thread, threaded, inline = asyncio.run(main())
    assert threaded != loop_thread
    assert inline == loop_thread


def test_async_tools_are_awaited() -> None:
    @tool
    async def double(n: int) -> int:
        """Double it."""
        await asyncio.sleep(0)
        return 2 * n

    assert asyncio.run(double.acall({"n": "21"})) == 42


def _no_annotation(x):
    return x


def _var_positional(*numbers: int) -> int:
    return sum(numbers)


def _var_keyword(**options: int) -> int:
    return len(options)


def _plain(x: int) -> int:
    return x


def _unresolvable(x: UndefinedType) -> int:  # noqa: F821 - the point of the test
    return 0


class _Opaque:
    pass


def _unsupported(x: _Opaque) -> int:
    return 0


@pytest.mark.parametrize(
    ("fn", "kwargs", "message"),
    [
        (_no_annotation, {}, "tool '_no_annotation': parameter 'x' needs a type annotation"),
        (
            _var_positional,
            {},
            "tool '_var_positional': *args/**kwargs cannot be described to a model",
        ),
        (_var_keyword, {}, "tool '_var_keyword': *args/**kwargs cannot be described to a model"),
        (_plain, {"name": "bad name"}, "tool name 'bad name' must match ^[a-zA-Z0-9_-]{1,64}$"),
        (_plain, {"name": "x" * 65}, f"tool name '{'x' * 65}' must match ^[a-zA-Z0-9_-]{{1,64}}$"),
        (_plain, {"name": "calc\n"}, "tool name 'calc\\n' must match ^[a-zA-Z0-9_-]{1,64}$"),
        (lambda x: x, {}, "tool name '<lambda>' must match ^[a-zA-Z0-9_-]{1,64}$"),
        (
            _unresolvable,
            {},
            "tool '_unresolvable': cannot resolve its type annotations "
            "(NameError: name 'UndefinedType' is not defined)",
        ),
        (
            _unsupported,
            {},
            f"tool '_unsupported': Unable to generate pydantic-core schema for {_Opaque!r}. "
            "Set `arbitrary_types_allowed=True` in the model_config to ignore this error "
            "or implement `__get_pydantic_core_schema__` on your type to fully support it.",
        ),
    ],
)
def test_bad_definitions_raise_tool_definition_error(
    fn: Any, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ToolDefinitionError) as info:
        make_tool(fn, **kwargs)
    assert str(info.value) == message
