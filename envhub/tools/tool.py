"""``@tool``: typed Python functions become OpenAI-format tools.

The JSON schema comes from the signature (through pydantic) and the Google-style docstring
(description and ``Args:``). Arguments are validated against the same pydantic model before the
function runs. Parameters annotated ``Annotated[T, Injected()]`` are hidden from the model and
filled from the env's tool context (a sandbox handle, a database, the episode state).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, get_args, get_origin, get_type_hints

import docstring_parser
from pydantic import BaseModel, ConfigDict, Field, PydanticUserError, ValidationError, create_model

from envhub.errors import ToolArgumentError, ToolDefinitionError

TOOL_NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
"""What OpenAI accepts as a function name."""


@dataclass(frozen=True)
class Injected:
    """Marks a tool parameter the model never sees; the env supplies it at call time.

    Args:
        key: Key in the env's tool context; defaults to the parameter's name.
    """

    key: str | None = None


@dataclass(frozen=True)
class Tool:
    """A callable tool with its OpenAI schema."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]
    arguments_model: type[BaseModel]
    injected: dict[str, str]
    """Hidden parameter name -> key in the tool context."""
    timeout: float | None = None
    inline: bool = False
    """Run a sync function on the event loop instead of a worker thread (only for cheap,
    bounded functions: an inline tool cannot be timed out)."""

    @property
    def schema(self) -> dict[str, Any]:
        """The tool in OpenAI ``tools`` format."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Check the model's arguments; return them converted to the annotated types."""
        if not isinstance(arguments, dict):
            raise ToolArgumentError(
                f"arguments must be a JSON object, got {type(arguments).__name__}"
            )
        try:
            model = self.arguments_model.model_validate(arguments)
        except ValidationError as e:
            raise ToolArgumentError(_describe_validation_error(self.name, e)) from None
        return {name: getattr(model, name) for name in type(model).model_fields}

    async def acall(self, arguments: dict[str, Any], context: dict[str, Any] | None = None) -> Any:
        """Validate ``arguments``, add injected ones from ``context``, and run the tool."""
        return await self.ainvoke(self.validate(arguments), context)

    async def ainvoke(
        self, validated: dict[str, Any], context: dict[str, Any] | None = None
    ) -> Any:
        """Run the tool on arguments already returned by :meth:`validate`, plus injected ones."""
        kwargs = {**validated, **self._injected_values(context or {})}
        if inspect.iscoroutinefunction(self.fn):
            return await self.fn(**kwargs)
        if self.inline:
            return self.fn(**kwargs)
        return await asyncio.to_thread(self.fn, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the underlying function directly (as in the env author's own code)."""
        return self.fn(*args, **kwargs)

    def _injected_values(self, context: dict[str, Any]) -> dict[str, Any]:
        missing = [key for key in self.injected.values() if key not in context]
        if missing:
            raise ToolDefinitionError(
                f"tool {self.name!r} needs {missing} injected, but the env's tool context has "
                f"only {sorted(context)}; return them from the env's `tool_context()`"
            )
        return {param: context[key] for param, key in self.injected.items()}


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    inline: bool = False,
) -> Any:
    """Turn a typed function into a :class:`Tool`. Use as ``@tool`` or ``@tool(name=...)``.

    Args:
        fn: The function. Every visible parameter needs a type annotation.
        name: Tool name shown to the model; defaults to the function's name.
        description: Defaults to the docstring's description.
        timeout: Seconds before a call is abandoned and reported to the model as timed out.
        inline: Run a sync function on the event loop (cheap, bounded functions only).
    """

    def wrap(f: Callable[..., Any]) -> Tool:
        return make_tool(f, name=name, description=description, timeout=timeout, inline=inline)

    return wrap(fn) if fn is not None else wrap


def make_tool(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    inline: bool = False,
) -> Tool:
    """Build a :class:`Tool` from a function (the non-decorator form of :func:`tool`)."""
    if isinstance(fn, Tool):
        return fn
    tool_name = name or fn.__name__
    if not TOOL_NAME_PATTERN.fullmatch(tool_name):
        raise ToolDefinitionError(f"tool name {tool_name!r} must match {TOOL_NAME_PATTERN.pattern}")
    doc = docstring_parser.parse(inspect.getdoc(fn) or "")
    arg_docs = {p.arg_name: p.description for p in doc.params}
    fields, injected = _fields_from_signature(fn, tool_name, arg_docs)
    try:
        model = create_model(
            f"{tool_name}_arguments", __config__=ConfigDict(extra="forbid"), **fields
        )
        parameters = _clean_schema(model.model_json_schema())
    except PydanticUserError as e:  # e.g. an annotation pydantic cannot describe
        raise ToolDefinitionError(f"tool {tool_name!r}: {str(e).splitlines()[0]}") from e
    text = description or "\n\n".join(filter(None, [doc.short_description, doc.long_description]))
    return Tool(
        name=tool_name,
        description=text or tool_name,
        parameters=parameters,
        fn=fn,
        arguments_model=model,
        injected=injected,
        timeout=timeout,
        inline=inline,
    )


def _fields_from_signature(
    fn: Callable[..., Any], tool_name: str, arg_docs: dict[str, str | None]
) -> tuple[dict[str, Any], dict[str, str]]:
    try:
        hints = get_type_hints(fn, include_extras=True)
    except Exception as e:  # a forward reference that does not resolve
        raise ToolDefinitionError(
            f"tool {tool_name!r}: cannot resolve its type annotations ({type(e).__name__}: {e})"
        ) from e
    fields: dict[str, Any] = {}
    injected: dict[str, str] = {}
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolDefinitionError(
                f"tool {tool_name!r}: *args/**kwargs cannot be described to a model"
            )
        if param.name not in hints:
            raise ToolDefinitionError(
                f"tool {tool_name!r}: parameter {param.name!r} needs a type annotation"
            )
        hint = hints[param.name]
        marker = _injected_marker(hint)
        if marker is not None:
            injected[param.name] = marker.key or param.name
            continue
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (hint, Field(default, description=arg_docs.get(param.name)))
    return fields, injected


def _injected_marker(hint: Any) -> Injected | None:
    if get_origin(hint) is Annotated:
        for extra in get_args(hint)[1:]:
            if isinstance(extra, Injected) or extra is Injected:
                return extra if isinstance(extra, Injected) else Injected()
    return None


def _clean_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Drop pydantic's ``title`` keys: they cost prompt tokens and tell the model nothing."""

    def strip(node: Any, in_properties: bool = False) -> Any:
        if isinstance(node, dict):
            return {
                k: strip(v, in_properties=(k == "properties"))
                for k, v in node.items()
                if in_properties or k != "title"
            }
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    cleaned = strip(schema)
    cleaned.setdefault("properties", {})
    return cleaned


def _describe_validation_error(tool_name: str, error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "arguments"
        kind = item["type"]
        if kind == "missing":
            parts.append(f"missing required argument {where!r}")
        elif kind == "extra_forbidden":
            parts.append(f"unexpected argument {where!r}")
        else:
            got = json.dumps(item.get("input"), default=str)[:80]
            parts.append(f"argument {where!r}: {item['msg']} (got {got})")
    return f"invalid arguments for {tool_name}: " + "; ".join(parts)
