"""OpenAI's Responses API wire format (``POST /responses``), to and from envhub's messages.

The OpenAI Agents SDK's default model (``OpenAIResponsesModel``) and ``client.responses.create``
speak this format: a request is ``instructions`` and a list of *items* (messages, the model's
``function_call`` s, the harness's ``function_call_output`` s), and a reply is a ``response``
object whose ``output`` is items again. This module reads a request into the same
:class:`~envhub.harness.wire.ChatRequest` the chat-completions route makes, so the env sees one
kind of call whichever API a harness speaks, and writes the policy's :class:`Reply` back as a
``response`` object or as its server-sent events.

The endpoint keeps no state between calls: a harness sends its whole history each time, so
``previous_response_id`` (and the other server-side state fields) are refused.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from envhub.harness.wire import (
    POLICY_MODEL,
    ChatRequest,
    Reply,
    WireError,
    content_text,
    overridden_fields,
    refuse_sampling,
)
from envhub.types import Message, ToolCall

STATEFUL_FIELDS: dict[str, str] = {
    "previous_response_id": "the endpoint keeps no responses",
    "conversation": "the endpoint keeps no conversations",
    "prompt": "the endpoint keeps no stored prompts",
}
"""Fields that point at server-side state, and why the endpoint cannot follow them."""

OVERRIDDEN_FIELDS = ("temperature", "max_output_tokens", "reasoning")
"""Sampling fields the run's config decides; a harness's values are ignored."""

ECHOED_FIELDS = ("instructions", "tools", "tool_choice", "parallel_tool_calls", "metadata")
"""Request fields a ``response`` object repeats back."""


@dataclass
class ResponsesRequest(ChatRequest):
    """One ``POST /responses`` body, read as a chat request, with what the reply repeats."""

    echo: dict[str, Any] = field(default_factory=dict)
    """The request's :data:`ECHOED_FIELDS` that were set."""


def read_responses_request(body: Any) -> ResponsesRequest:
    """Check and read a Responses API body.

    Raises:
        WireError: Not an object, no input, an item or content part that is not text, a tool that
            is not a function, a field that needs server-side state (``previous_response_id``,
            ...), or a sampling field a training run must refuse (``top_p < 1``, ...).
    """
    if not isinstance(body, dict):
        raise WireError("the request body must be a JSON object")
    for name, why in STATEFUL_FIELDS.items():
        if body.get(name) is not None:
            raise WireError(
                f"{name}={body[name]!r}: {why}; send the whole history in `input` instead"
            )
    refuse_sampling(body)
    messages = read_input(body.get("input"))
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.insert(0, Message(role="system", content=instructions))
    return ResponsesRequest(
        messages=messages,
        tools=read_tools(body.get("tools")),
        stream=bool(body.get("stream")),
        model=str(body.get("model") or POLICY_MODEL),
        overridden=_overridden(body),
        echo={k: body[k] for k in ECHOED_FIELDS if body.get(k) is not None},
    )


def _overridden(body: dict[str, Any]) -> list[str]:
    overridden = overridden_fields(body, OVERRIDDEN_FIELDS)
    text = body.get("text")
    text_format = text.get("format") if isinstance(text, dict) else None
    if isinstance(text_format, dict) and text_format.get("type") not in (None, "text"):
        overridden.append("text.format")  # structured output needs constrained decoding
    return overridden


def read_input(raw: Any) -> list[Message]:
    """``input`` (a string, or a list of items) as envhub messages.

    A ``function_call`` item joins the assistant message before it (the Responses API splits
    one assistant turn into a message item and call items; the chat format, which the env
    compares histories in, keeps them together); ``reasoning`` items are skipped.
    """
    if isinstance(raw, str) and raw:
        return [Message(role="user", content=raw)]
    if not isinstance(raw, list) or not raw:
        raise WireError("`input` must be a non-empty string or a non-empty list of items")
    messages: list[Message] = []
    for index, item in enumerate(raw):
        _read_item(item, f"input[{index}]", messages)
    if not messages:
        raise WireError("`input` has no messages (only reasoning items)")
    return messages


def _read_item(item: Any, where: str, messages: list[Message]) -> None:
    """Append the message ``item`` makes to ``messages`` (or extend the last one)."""
    if not isinstance(item, dict):
        raise WireError(f"{where} must be an object")
    kind = item.get("type", "message")  # an "easy" input message has no type
    if kind == "message":
        messages.append(_read_message(item, where))
    elif kind == "function_call":
        _add_call(messages, _read_call(item, where))
    elif kind == "function_call_output":
        call_id = item.get("call_id")
        if not isinstance(call_id, str):
            raise WireError(f"{where}: a function_call_output needs call_id")
        content = _text(item.get("output"), where)
        messages.append(Message(role="tool", content=content, tool_call_id=call_id))
    elif kind != "reasoning":  # the policy's reasoning is in its text; nothing to re-send
        raise WireError(
            f"{where}: items of type {kind!r} are not supported (messages, function_call, "
            "function_call_output and reasoning are)"
        )


def _read_message(item: dict[str, Any], where: str) -> Message:
    role = item.get("role")
    if role not in ("user", "system", "developer", "assistant"):
        raise WireError(f"{where}: unknown role {role!r}")
    role = "system" if role == "developer" else role
    return Message(role=role, content=_text(item.get("content"), where))


def _text(content: Any, where: str) -> str:
    """A message's (or a call output's) content as one string; it must be there."""
    text = content_text(content, where)
    if text is None:
        raise WireError(f"{where}: content must be a string or a list of parts")
    return text


def _read_call(item: dict[str, Any], where: str) -> ToolCall:
    name, call_id = item.get("name"), item.get("call_id")
    if not isinstance(name, str) or not isinstance(call_id, str):
        raise WireError(f"{where}: a function_call needs name and call_id")
    arguments = item.get("arguments", "{}")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    return ToolCall.make(call_id, name, arguments)


def _add_call(messages: list[Message], call: ToolCall) -> None:
    """Join ``call`` to the assistant message just before it, or start one with no text."""
    if messages and messages[-1].role == "assistant":
        last = messages[-1]
        calls = (*(last.tool_calls or ()), call)
        messages[-1] = last.model_copy(update={"tool_calls": calls})
    else:
        messages.append(Message(role="assistant", content=None, tool_calls=(call,)))


def read_tools(raw: Any) -> list[dict[str, Any]] | None:
    """Responses-format function tools (``{type, name, description, parameters, strict}``) in
    the chat format the rest of envhub uses (``{type, function: {name, description,
    parameters, strict}}``): the tools a chat-completions harness would send for the same
    functions, so that the chat template renders them alike."""
    if raw in (None, []):
        return None
    if not isinstance(raw, list):
        raise WireError("`tools` must be a list")
    tools = []
    for i, tool in enumerate(raw):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise WireError(f"tools[{i}]: only function tools are supported (got {kind!r})")
        if not isinstance(tool.get("name"), str):
            raise WireError(f"tools[{i}] needs a name")
        keys = ("name", "description", "parameters", "strict")
        function = {k: tool[k] for k in keys if tool.get(k) is not None}
        tools.append({"type": "function", "function": function})
    return tools


# -- replies ------------------------------------------------------------------------------------


def _item_ids(request_id: str) -> tuple[str, str]:
    """The message item's id and the prefix of call items' ids, from the response's id."""
    suffix = request_id.removeprefix("resp_")
    return f"msg_{suffix}", f"fc_{suffix}_"


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def output_items(reply: Reply, request_id: str) -> list[dict[str, Any]]:
    """The reply as output items: a ``message`` when it has text, then a ``function_call`` per
    call, in the order the env's :attr:`Reply.message` has them."""
    message_id, call_prefix = _item_ids(request_id)
    items: list[dict[str, Any]] = []
    if reply.content:
        status = "incomplete" if reply.finish_reason == "length" else "completed"
        items.append(
            {
                "type": "message",
                "id": message_id,
                "role": "assistant",
                "status": status,
                "content": [_text_part(reply.content)],
            }
        )
    for i, call in enumerate(reply.tool_calls):
        items.append(
            {
                "type": "function_call",
                "id": f"{call_prefix}{i}",
                "call_id": call.id,
                "name": call.function.name,
                "arguments": call.function.arguments,
                "status": "completed",
            }
        )
    return items


def _usage(reply: Reply) -> dict[str, Any]:
    # The endpoint never sees the prompt's tokens (the runner renders them): input is 0.
    return {
        "input_tokens": 0,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": reply.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": reply.completion_tokens,
    }


def response_body(
    reply: Reply | None, request_id: str, request: ResponsesRequest, created_at: int | None = None
) -> dict[str, Any]:
    """A ``response`` object: ``completed`` (``incomplete`` when the turn hit its token limit),
    or ``in_progress`` with no output yet when ``reply`` is ``None`` (for the stream's first
    events)."""
    if reply is None:
        status, details, output, usage = "in_progress", None, [], None
    else:
        cut = reply.finish_reason == "length"
        status = "incomplete" if cut else "completed"
        details = {"reason": "max_output_tokens"} if cut else None
        output, usage = output_items(reply, request_id), _usage(reply)
    echo = request.echo
    return {
        "id": request_id,
        "object": "response",
        "created_at": created_at if created_at is not None else int(time.time()),
        "status": status,
        "error": None,
        "incomplete_details": details,
        "instructions": echo.get("instructions"),
        "model": request.model,
        "output": output,
        "parallel_tool_calls": echo.get("parallel_tool_calls", True),
        "tool_choice": echo.get("tool_choice", "auto"),
        "tools": echo.get("tools", []),
        "metadata": echo.get("metadata", {}),
        "previous_response_id": None,
        "store": False,
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "usage": usage,
    }


def response_events(reply: Reply, request_id: str, request: ResponsesRequest) -> Iterator[str]:
    """The same reply as the Responses API's server-sent events: ``response.created``, each
    output item added, its content streamed and done, then ``response.completed`` (or
    ``response.incomplete``)."""
    created_at = int(time.time())
    sequence = itertools.count()

    def event(kind: str, **fields: Any) -> str:
        body = {"type": kind, "sequence_number": next(sequence), **fields}
        return f"event: {kind}\ndata: {json.dumps(body)}\n\n"

    started = response_body(None, request_id, request, created_at)
    yield event("response.created", response=started)
    yield event("response.in_progress", response=started)
    for index, item in enumerate(output_items(reply, request_id)):
        if item["type"] == "message":
            yield from _message_events(event, item, index)
        else:
            yield from _call_events(event, item, index)
    final = response_body(reply, request_id, request, created_at)
    yield event(f"response.{final['status']}", response=final)


def _message_events(event: Any, item: dict[str, Any], index: int) -> Iterator[str]:
    """A message item's events: added, its text part added, streamed and done, item done."""
    text = item["content"][0]["text"]
    where = {"item_id": item["id"], "output_index": index, "content_index": 0}
    yield event(
        "response.output_item.added",
        output_index=index,
        item={**item, "status": "in_progress", "content": []},
    )
    yield event("response.content_part.added", **where, part=_text_part(""))
    yield event("response.output_text.delta", **where, delta=text, logprobs=[])
    yield event("response.output_text.done", **where, text=text, logprobs=[])
    yield event("response.content_part.done", **where, part=_text_part(text))
    yield event("response.output_item.done", output_index=index, item=item)


def _call_events(event: Any, item: dict[str, Any], index: int) -> Iterator[str]:
    """A function call item's events: added, its arguments streamed and done, item done."""
    where = {"item_id": item["id"], "output_index": index}
    yield event(
        "response.output_item.added",
        output_index=index,
        item={**item, "status": "in_progress", "arguments": ""},
    )
    yield event("response.function_call_arguments.delta", **where, delta=item["arguments"])
    yield event(
        "response.function_call_arguments.done",
        **where,
        name=item["name"],
        arguments=item["arguments"],
    )
    yield event("response.output_item.done", output_index=index, item=item)
