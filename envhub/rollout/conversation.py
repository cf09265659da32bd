"""A given conversation as a token record, as if the policy had sampled its assistant turns.

Supervised fine-tuning trains on conversations someone else wrote (an env's reference policy,
recorded episodes, a dataset of OpenAI ``messages``). They are rendered with the policy's own
chat template and checked with the rollout's prefix rule (:mod:`envhub.rollout.tokens`): the
record grows turn by turn, each assistant turn is the template's rendering of it up to and
including the token that ends a turn, and the next turn's prompt must extend the record token
for token. A template that rewrites an earlier turn (Qwen3 dropping old ``<think>`` blocks) breaks
that rule: the conversation is returned with its *drift* and no record, so that the caller
reports it instead of training on tokens the model would never see in that order.

Tools are shown as in rollouts (:class:`~envhub.rollout.tool_prompt.ToolsInPrompt`), and an
assistant turn whose ``tool_calls`` are structured (OpenAI format, no markup in the text) is
written as the text a model writes: one ``<tool_call>`` block per call
(:data:`envhub.tools.prompt.TOOL_FORMAT_HINT`), the format envhub's parsers read.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from envhub.errors import EnvhubError
from envhub.inference.base import ChatTokenizer
from envhub.rollout.tokens import TokenTrace
from envhub.rollout.tool_prompt import ToolsInPrompt
from envhub.tools.prompt import tool_call_block
from envhub.types import Message, as_message

TOOL_MARKERS = ("<tool_call>", "[TOOL_CALLS]")
"""Markup that shows a turn's text already holds its calls (Hermes/Qwen, Mistral)."""


@dataclass(frozen=True)
class ConversationTokens:
    """A conversation's token record, or where the chat template broke the prefix rule."""

    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    """1 on the assistant turns' tokens (their end-of-turn token included), 0 elsewhere."""
    prompt_length: int = 0
    """Tokens before the first assistant turn."""
    drift: dict[str, Any] | None = None
    """Where the rendering of a later turn stopped extending the record (``turn``,
    ``position``, the ``recorded`` and ``rendered`` ids there); the record is then empty."""

    @property
    def ok(self) -> bool:
        """The record is token-exact (no drift)."""
        return self.drift is None

    @property
    def trained_tokens(self) -> int:
        """Tokens in the loss."""
        return sum(self.loss_mask)


def raw_assistant_text(message: Message) -> Message:
    """An assistant message as a model writes it: structured ``tool_calls`` without markup in
    the text become ``<tool_call>`` blocks after the content (other messages unchanged)."""
    if message.role != "assistant" or not message.tool_calls:
        return message
    content = message.content or ""
    if any(marker in content for marker in TOOL_MARKERS):
        return message
    blocks = [_call_block(call.name, call.function.arguments) for call in message.tool_calls]
    text = "\n".join(([content.strip()] if content.strip() else []) + blocks)
    return message.model_copy(update={"content": text})


def _call_block(name: str, arguments: str) -> str:
    try:
        parsed: Any = json.loads(arguments) if arguments else {}
    except ValueError:
        parsed = arguments  # kept as written: the model would have to write it so
    return tool_call_block(name, parsed)


async def render_conversation(
    tokenizer: ChatTokenizer,
    messages: Sequence[Message | dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    end_ids: Sequence[int] = (),
) -> ConversationTokens:
    """The token record of ``messages`` with ``tokenizer``'s chat template (see the module doc).

    Args:
        tokenizer: The policy's chat tokenizer (wrapped so that the tools reach the model).
        messages: The conversation, OpenAI format; trailing messages after the last assistant
            turn are left out (nothing to learn from them).
        tools: The OpenAI schemas of the tools offered in the conversation.
        end_ids: The ids that end an assistant turn (the EOS tokens): a turn's trained tokens
            stop after the first of them; the template's tokens after it are context.

    Raises:
        EnvhubError: The conversation has no assistant turn.
    """
    chat = [raw_assistant_text(as_message(m)) for m in messages]
    turns = [i for i, m in enumerate(chat) if m.role == "assistant"]
    if not turns:
        raise EnvhubError("the conversation has no assistant turn to learn from")
    rendering = tokenizer if isinstance(tokenizer, ToolsInPrompt) else ToolsInPrompt(tokenizer)
    trace = TokenTrace()
    trace.start(await rendering.render(chat[: turns[0]], tools, add_generation_prompt=True))
    for number, index in enumerate(turns):
        if number and not trace.extend_to(
            await rendering.render(chat[:index], tools, add_generation_prompt=True), number
        ):
            return ConversationTokens(drift=trace.drift[-1])
        full = await rendering.render(chat[: index + 1], tools, add_generation_prompt=False)
        if full[: len(trace.ids)] != trace.ids:
            trace.extend_to(full, number)  # records where they part
            return ConversationTokens(drift=trace.drift[-1])
        trace.add_sampled(_through_end(full[len(trace.ids) :], end_ids), None)
    return ConversationTokens(list(trace.ids), list(trace.mask), trace.prompt_length)


def _through_end(tokens: list[int], end_ids: Sequence[int]) -> list[int]:
    """``tokens`` up to and including the first end-of-turn id (all of them when none is)."""
    ends = set(end_ids)
    for i, token in enumerate(tokens):
        if token in ends:
            return tokens[: i + 1]
    return tokens
