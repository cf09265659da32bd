"""OpenAI's chat-completions wire format, to and from envhub's messages.

A harness sends what the OpenAI SDKs send: messages whose ``content`` may be a list of parts,
``developer`` roles, tool calls with JSON-text arguments, sampling fields. This module turns a
request body into envhub :class:`~envhub.types.Message` s, compares conversations the way a
harness re-sends them (so that an echoed history is recognised as the same one), checks the
sampling fields against the run's, and writes replies (one JSON body, or server-sent events).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from envhub.types import Message, ToolCall

REFUSED_FIELDS: dict[str, str] = {
    "logit_bias": "a logit bias changes the sampler's distribution",
    "top_k": "top-k truncates the sampler's distribution",
    "min_p": "min-p truncates the sampler's distribution",
}
"""Request fields a training run cannot honour, and why (the policy's ratio would be biased)."""

OVERRIDDEN_FIELDS = ("temperature", "max_tokens", "max_completion_tokens", "stop", "seed")
"""Sampling fields the run's config decides; a harness's values are ignored (as is a
``tool_choice`` that forces a call: the policy decides whether to call)."""

TEXT_PARTS = ("input_text", "output_text", "text")
"""Content part types read as text, in either API (a ``refusal`` part is read as its text)."""


class WireError(ValueError):
    """A request the endpoint cannot serve; the message says what to change."""


POLICY_MODEL = "policy"
"""The model name the endpoint lists and programs get (``OPENAI_MODEL``, ``model``); a call may
name any model: the policy answers it."""


@dataclass
class ChatRequest:
    """One ``POST /chat/completions`` body, read."""

    messages: list[Message]
    tools: list[dict[str, Any]] | None
    stream: bool = False
    include_usage: bool = False
    model: str = POLICY_MODEL
    overridden: list[str] = field(default_factory=list)
    """Sampling fields the harness set that the run overrides."""


def read_chat_request(body: Any) -> ChatRequest:
    """Check and read a chat-completions body.

    Raises:
        WireError: Not an object, no messages, a message of an unknown shape, a tool that is not
            a function, or a sampling field a training run must refuse (``n > 1``, ``top_p < 1``,
            a logit bias, ...).
    """
    if not isinstance(body, dict):
        raise WireError("the request body must be a JSON object")
    refuse_sampling(body)
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise WireError("`messages` must be a non-empty list")
    messages = [read_message(m, i) for i, m in enumerate(raw)]
    tools = _read_tools(body.get("tools"))
    options = body.get("stream_options") or {}
    return ChatRequest(
        messages=messages,
        tools=tools,
        stream=bool(body.get("stream")),
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        model=str(body.get("model") or POLICY_MODEL),
        overridden=overridden_fields(body, OVERRIDDEN_FIELDS),
    )


def overridden_fields(body: dict[str, Any], fields: tuple[str, ...]) -> list[str]:
    """Which of ``fields`` (an API's sampling fields) ``body`` sets, plus ``tool_choice`` when
    it forces a call (that needs constrained decoding; the policy decides whether to call)."""
    overridden = [k for k in fields if body.get(k) is not None]
    if body.get("tool_choice") not in (None, "auto", "none"):
        overridden.append("tool_choice")
    return overridden


def refuse_sampling(body: dict[str, Any]) -> None:
    """Raise :class:`WireError` for a sampling field a training run must refuse (any API's
    body: ``n > 1``, ``top_p < 1``, a logit bias, penalties)."""
    n = body.get("n")
    if n not in (None, 1):
        raise WireError(f"n={n!r}: the run samples one completion per call; send n=1")
    top_p = body.get("top_p")
    if top_p is not None and (not isinstance(top_p, (int, float)) or top_p < 1):
        raise WireError(
            f"top_p={top_p!r}: top-p truncates the sampler's distribution, which biases the "
            "policy's ratio in training; leave top_p unset (or 1)"
        )
    for name, why in REFUSED_FIELDS.items():
        if body.get(name) not in (None, {}, 0):
            raise WireError(f"{name}={body[name]!r}: {why}; leave it unset")
    for name in ("presence_penalty", "frequency_penalty"):
        if body.get(name) not in (None, 0, 0.0):
            raise WireError(
                f"{name}={body[name]!r} reshapes the sampler's distribution; leave it 0"
            )


def content_text(content: Any, where: str) -> str | None:
    """``content`` as one string: a string, or a list of parts whose text (and refusals) are
    joined; ``None`` stays ``None``. Other parts (images, audio, files) are refused."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise WireError(f"{where}: content must be a string or a list of parts")
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if isinstance(part, str):
            texts.append(part)
        elif kind in TEXT_PARTS:
            texts.append(str(part.get("text", "")))
        elif kind == "refusal":
            texts.append(str(part.get("refusal", "")))
        else:
            raise WireError(f"{where}: content part of type {kind!r} is not supported (text only)")
    return "".join(texts)


def read_message(raw: Any, index: int) -> Message:
    """One wire message as an envhub :class:`Message` (``developer`` reads as ``system``)."""
    where = f"messages[{index}]"
    if not isinstance(raw, dict):
        raise WireError(f"{where} must be an object")
    role = raw.get("role")
    role = "system" if role == "developer" else role
    if role not in ("system", "user", "assistant", "tool"):
        raise WireError(f"{where}: unknown role {raw.get('role')!r}")
    content = content_text(raw.get("content"), where)
    calls = None
    if role == "assistant" and raw.get("tool_calls"):
        calls = tuple(_read_call(c, f"{where}.tool_calls") for c in raw["tool_calls"])
    return Message(
        role=role,
        content=content,
        tool_calls=calls,
        tool_call_id=raw.get("tool_call_id") if role == "tool" else None,
        name=raw.get("name") if role == "tool" else None,
    )


def _read_call(raw: Any, where: str) -> ToolCall:
    function = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise WireError(f"{where}: each tool call needs function.name")
    arguments = function.get("arguments", "{}")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    return ToolCall.make(str(raw.get("id") or ""), function["name"], arguments)


def _read_tools(raw: Any) -> list[dict[str, Any]] | None:
    if raw in (None, []):
        return None
    if not isinstance(raw, list):
        raise WireError("`tools` must be a list")
    for i, tool in enumerate(raw):
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise WireError(f"tools[{i}]: only function tools are supported")
        if not isinstance(tool.get("function"), dict) or "name" not in tool["function"]:
            raise WireError(f"tools[{i}] needs function.name")
    return [{"type": "function", "function": t["function"]} for t in raw]


# -- comparing conversations as a harness re-sends them ----------------------------------------


def _arguments_key(text: str) -> Any:
    try:
        return json.dumps(json.loads(text), sort_keys=True)
    except ValueError:
        return text


def message_key(message: Message) -> tuple[Any, ...]:
    """What must match for a re-sent message to be the same one: role, text (``None`` and ""
    alike, outer whitespace ignored), tool calls by name and arguments (as JSON values, so
    re-serialised arguments match), and the call a tool message answers."""
    calls = tuple(
        (c.function.name, _arguments_key(c.function.arguments)) for c in message.tool_calls or ()
    )
    text = (message.content or "").strip()
    answers = message.tool_call_id if message.role == "tool" else None
    return (message.role, text, calls, answers)


def extends(sent: Sequence[Message], received: Sequence[Message]) -> bool:
    """Whether ``received`` starts with ``sent``, message by message (see :func:`message_key`)."""
    if len(received) < len(sent):
        return False
    return all(message_key(a) == message_key(b) for a, b in zip(sent, received, strict=False))


# -- replies ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """The assistant turn as the harness sees it."""

    content: str | None
    tool_calls: list[ToolCall]
    finish_reason: str
    completion_tokens: int = 0

    @property
    def message(self) -> Message:
        """The reply as the harness will send it back in its next request."""
        return Message(
            role="assistant", content=self.content, tool_calls=tuple(self.tool_calls) or None
        )


def _calls_json(calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    return [c.model_dump(mode="json") for c in calls]


def _usage(reply: Reply) -> dict[str, int]:
    return {
        "prompt_tokens": 0,
        "completion_tokens": reply.completion_tokens,
        "total_tokens": reply.completion_tokens,
    }


def completion_body(reply: Reply, request_id: str, model: str) -> dict[str, Any]:
    """A non-streaming ``chat.completion`` object."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = _calls_json(reply.tool_calls)
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": reply.finish_reason, "logprobs": None}
        ],
        "usage": _usage(reply),
    }


def completion_events(
    reply: Reply, request_id: str, model: str, include_usage: bool
) -> Iterator[str]:
    """The same reply as ``chat.completion.chunk`` server-sent events, ending with ``[DONE]``."""
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
        body = {
            "id": request_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
            **extra,
        }
        return f"data: {json.dumps(body)}\n\n"

    yield chunk({"role": "assistant", "content": ""})
    if reply.content:
        yield chunk({"content": reply.content})
    for i, call in enumerate(reply.tool_calls):
        function = {"name": call.function.name, "arguments": call.function.arguments}
        yield chunk(
            {"tool_calls": [{"index": i, "id": call.id, "type": "function", "function": function}]}
        )
    yield chunk({}, reply.finish_reason)
    if include_usage:
        body = {
            "id": request_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [],
            "usage": _usage(reply),
        }
        yield f"data: {json.dumps(body)}\n\n"
    yield "data: [DONE]\n\n"


def error_body(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    """OpenAI's error object (the SDKs raise it as ``BadRequestError`` and the like)."""
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}
