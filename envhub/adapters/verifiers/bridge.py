"""The model client verifiers talks to, and conversions between its messages and envhub's."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Sequence
from typing import Any

from envhub.adapters.verifiers._load import MODEL
from envhub.errors import EnvhubError
from envhub.state import State
from envhub.types import AssistantTurn, Message, ToolCall


@functools.cache
def _bridge_class() -> type:
    from verifiers.clients.client import Client

    class EnvhubTurnClient(Client):
        """A verifiers client whose responses are the turns envhub's runner sampled: each
        request is queued with a future, and the rollout waits on that future."""

        def __init__(self, requests: asyncio.Queue) -> None:
            super().__init__(None)
            self.requests = requests

        def setup_client(self, config: Any) -> Any:
            return None

        async def to_native_tool(self, tool: Any) -> Any:
            return tool

        async def to_native_prompt(self, messages: Any) -> tuple[Any, dict]:
            return messages, {}

        async def get_native_response(self, prompt: Any, model: str, sampling_args: Any,
                                      tools: Any = None, **kwargs: Any) -> Any:  # fmt: skip
            reply = asyncio.get_running_loop().create_future()
            await self.requests.put((prompt, reply))
            return await reply

        async def raise_from_native_response(self, response: Any) -> None:
            return None

        async def from_native_response(self, response: Any) -> Any:
            return response

        async def close(self) -> None:
            return None

    return EnvhubTurnClient


def _bridge_client(requests: asyncio.Queue) -> Any:
    return _bridge_class()(requests)


# -- messages, tools and turns --------------------------------------------------------------------


def _text(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else getattr(part, "type", None)
        if kind != "text":
            raise EnvhubError(f"verifiers message part of type {kind!r}: envhub carries text only")
        parts.append(part["text"] if isinstance(part, dict) else part.text)
    return "".join(parts)


def _to_message(message: Any) -> Message:
    """An envhub message from a verifiers one (a pydantic message or an OpenAI dict)."""
    get = message.get if isinstance(message, dict) else functools.partial(getattr, message)
    calls = get("tool_calls", None)
    return Message(
        role=get("role", None),
        content=_text(get("content", None)),
        tool_calls=tuple(_to_call(c) for c in calls) if calls else None,
        tool_call_id=get("tool_call_id", None),
    )


def _to_call(call: Any) -> ToolCall:
    if isinstance(call, dict):
        function = call.get("function") or call
        return ToolCall.make(call["id"], function["name"], function["arguments"])
    return ToolCall.make(call.id, call.name, call.arguments)


def _tool_schema(tool: Any) -> dict[str, Any]:
    """An OpenAI function schema from a ``vf.Tool`` (name, description, parameters)."""
    function = {"name": tool.name, "description": tool.description, "parameters": tool.parameters}
    if tool.strict is not None:
        function["strict"] = tool.strict
    return {"type": "function", "function": function}


def _response(turn: AssistantTurn, calls: Sequence[ToolCall]) -> Any:
    """The ``vf.Response`` verifiers would have got from a server for this turn."""
    from verifiers.types import Response, ResponseMessage, Usage
    from verifiers.types import ToolCall as VfToolCall

    length = turn.finish_reason == "length"
    message = ResponseMessage(
        content=turn.message.content or "",
        tool_calls=[
            VfToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments) for c in calls
        ]
        or None,
        finish_reason="length" if length else ("tool_calls" if calls else "stop"),
        is_truncated=length,
    )
    usage = None
    if turn.num_tokens is not None:
        usage = Usage(
            prompt_tokens=0,
            reasoning_tokens=0,
            completion_tokens=turn.num_tokens,
            total_tokens=turn.num_tokens,
        )
    return Response(id="envhub", created=int(time.time()), model=MODEL, usage=usage,
                    message=message)  # fmt: skip


def _new_messages(
    state: State, vf_messages: Sequence[Any], offset: int = 0, strict: bool = False
) -> list[Message]:
    """What verifiers' conversation has beyond envhub's (``offset``: where ``vf_messages``
    starts in it); verifiers may only append, as envhub's token record does (``strict``: a
    shorter history is an error, not an episode that ended before its first request)."""
    known = len(state.messages) - offset
    if len(vf_messages) < known and strict:
        raise EnvhubError(
            "the verifiers environment rewrote the conversation (its history is shorter than "
            "envhub's); envhub needs each turn's prompt to extend the last"
        )
    return [_to_message(m) for m in vf_messages[known:]]


# -- the rubric -----------------------------------------------------------------------------------
