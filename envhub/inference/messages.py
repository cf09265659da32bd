"""Messages as chat templates and OpenAI-style servers expect them.

Shared by every engine that renders a conversation itself (the HTTP engine's ``/tokenize``
path, the trainer's in-process engines), so that all of them feed a template the same dicts.
"""

from __future__ import annotations

from typing import Any

from envhub.types import Message

__all__ = ["chat_template_message", "wire_message"]


def wire_message(message: Message, for_template: bool = False) -> dict[str, Any]:
    """A message as sent to a server. Assistant content is the raw sampled text, tool-call
    markup included, so parsed ``tool_calls`` are dropped when they came from that text.

    Args:
        message: The message to convert.
        for_template: Always drop an assistant's parsed ``tool_calls`` (the text holds them).
    """
    data = message.to_openai()
    if (
        message.role == "assistant"
        and message.tool_calls
        and (for_template or _calls_in_text(message))
    ):
        data.pop("tool_calls")
    data.setdefault("content", "")
    return data


def chat_template_message(message: Message) -> dict[str, Any]:
    """A message as a chat template must see it to reproduce the sampled tokens: an assistant
    turn is its raw text (tool-call markup included), never re-serialised ``tool_calls``."""
    return wire_message(message, for_template=True)


def _calls_in_text(message: Message) -> bool:
    text = message.content or ""
    return any(marker in text for marker in ("<tool_call>", "[TOOL_CALLS]", '"name"'))
