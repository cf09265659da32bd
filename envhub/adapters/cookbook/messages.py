"""Messages and tools between envhub's OpenAI-shaped types and the cookbook's renderer dicts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tinker_cookbook import renderers

from envhub.tools.prompt import with_tools_in_system
from envhub.types import FunctionCall, Message, ToolCall


def to_cookbook(message: Message) -> renderers.Message:
    """An envhub message as the renderer's ``Message`` dict (tool calls and ids kept)."""
    out: dict[str, Any] = {"role": message.role, "content": message.content or ""}
    if message.tool_calls:
        out["tool_calls"] = [
            renderers.ToolCall(
                id=call.id,
                function=renderers.ToolCall.FunctionBody(
                    name=call.function.name, arguments=call.function.arguments
                ),
            )
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    return out  # type: ignore[return-value]


def from_cookbook(message: renderers.Message, call_prefix: str) -> Message:
    """A renderer ``Message`` dict as an envhub message, of any role.

    Tool calls become ``tool_calls`` (ids ``call_prefix + i`` where none was given); calls the
    renderer could not parse go back into the text, so that the env's own parser sees the
    attempt and answers it as a malformed call rather than as no call at all."""
    text = renderers.get_text_content(message)
    unparsed = [call.raw_text for call in message.get("unparsed_tool_calls") or []]
    if unparsed:
        text = "\n".join([text, *unparsed]) if text else "\n".join(unparsed)
    calls = tuple(
        ToolCall(
            id=call.id or f"{call_prefix}{i}",
            function=FunctionCall(name=call.function.name, arguments=call.function.arguments),
        )
        for i, call in enumerate(message.get("tool_calls") or [])
    )
    return Message(
        role=message["role"],
        content=text,
        tool_calls=calls or None,
        tool_call_id=message.get("tool_call_id"),
        name=message.get("name"),
    )


def openai_tools(specs: Sequence[renderers.ToolSpec]) -> list[dict[str, Any]]:
    """The renderer's ``ToolSpec`` dicts as OpenAI tool schemas."""
    return [{"type": "function", "function": dict(spec)} for spec in specs]


def tool_specs(schemas: Sequence[dict[str, Any]]) -> list[renderers.ToolSpec]:
    """OpenAI tool schemas as the renderer's ``ToolSpec`` dicts."""
    specs = []
    for schema in schemas:
        function = schema.get("function", schema)
        specs.append(
            renderers.ToolSpec(
                name=function["name"],
                description=function.get("description", ""),
                parameters=function.get("parameters", {"type": "object", "properties": {}}),
            )
        )
    return specs


def opening(
    renderer: renderers.Renderer,
    messages: Sequence[Message],
    tools: Sequence[dict[str, Any]] | None,
) -> list[renderers.Message]:
    """A conversation's messages for ``renderer``, its tools shown to the model.

    A renderer with a tool format writes the tools its own way (its system prefix, with the
    env's system prompt in it), and parses the calls back. One without (``role_colon``) gets
    envhub's format in the system prompt (:mod:`envhub.tools.prompt`), which the env's own
    parser reads from the turn's text."""
    if not tools:
        return [to_cookbook(m) for m in messages]
    system = "\n\n".join(m.content or "" for m in messages if m.role == "system")
    try:
        prefix = renderer.create_conversation_prefix_with_tools(tool_specs(tools), system)
    except NotImplementedError:
        return [to_cookbook(m) for m in with_tools_in_system(messages, list(tools))]
    return [*prefix, *(to_cookbook(m) for m in messages if m.role != "system")]
