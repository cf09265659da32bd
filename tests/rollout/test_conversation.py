"""Given conversations as token records: which tokens are trained, token by token, with the
byte tokenizer and SmolLM2's own template; a template that rewrites an earlier turn is reported,
not rendered."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from envhub.errors import EnvhubError
from envhub.rollout.conversation import raw_assistant_text, render_conversation
from envhub.testing import ByteChatTokenizer
from envhub.types import Message, ToolCall, assistant, system, tool_message, user

TOOL = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate an expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}
CALL = ToolCall.make("call_0", "calculate", {"expression": "6 * 7"})
MARKUP = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "6 * 7"}}\n</tool_call>'
TWO_TURNS = [
    system("Use the tool."),
    user("What is 6 * 7?"),
    assistant("", [CALL]),  # OpenAI format: the call is structured, the text empty
    tool_message("42", "call_0", "calculate"),
    assistant("It is \\boxed{42}."),
]


def _render(tokenizer: Any, messages: list[Message], **kwargs: Any) -> Any:
    return asyncio.run(render_conversation(tokenizer, messages, [TOOL], **kwargs))


def test_a_structured_call_is_written_as_the_markup_a_model_writes() -> None:
    assert raw_assistant_text(TWO_TURNS[2]).content == MARKUP
    with_text = assistant("Let me compute.", [CALL])
    assert raw_assistant_text(with_text).content == "Let me compute.\n" + MARKUP
    already = assistant(MARKUP, [CALL])
    assert raw_assistant_text(already) is already
    assert raw_assistant_text(TWO_TURNS[1]) is TWO_TURNS[1]


def test_byte_template_trains_each_assistant_turn_and_its_end_token_only() -> None:
    tok = ByteChatTokenizer()
    end = tok.IM_END
    record = _render(tok, TWO_TURNS, end_ids=[end])
    assert record.ok
    # The record is the whole conversation rendered, up to the last turn's end token.
    full = tok.render_sync(
        [*TWO_TURNS[:2], assistant(MARKUP), *TWO_TURNS[3:]], [TOOL], add_generation_prompt=False
    )
    assert record.token_ids == full[: len(record.token_ids)]
    assert record.token_ids[-1] == end and len(full) == len(record.token_ids) + 1  # + "\n"
    # Token by token: the mask is 1 exactly on each turn's text and its <|im_end|>.
    turn1, turn2 = tok.encode(MARKUP) + [end], tok.encode("It is \\boxed{42}.") + [end]
    prompt = tok.render_sync(TWO_TURNS[:2], [TOOL], add_generation_prompt=True)
    middle = tok.encode("\n") + tok.render_sync(TWO_TURNS[3:4], None, True)
    assert record.token_ids == prompt + turn1 + middle + turn2
    assert record.loss_mask == [0] * len(prompt) + [1] * len(turn1) + [0] * len(middle) + [1] * len(
        turn2
    )
    assert record.prompt_length == len(prompt) and record.trained_tokens == len(turn1 + turn2)


def test_smollm2_template_trains_the_assistant_turns(smollm2_dir: Path) -> None:
    from transformers import AutoTokenizer

    from envhub.trainer.engines.hf_tokenizer import HFChatTokenizer

    hf = AutoTokenizer.from_pretrained(smollm2_dir)
    chat = HFChatTokenizer(hf)
    record = _render(chat, TWO_TURNS, end_ids=chat.eos_token_ids)
    assert record.ok
    spans, current = [], []
    for token, trained in zip(record.token_ids, record.loss_mask, strict=True):
        if trained:
            current.append(token)
        elif current:
            spans.append(current)
            current = []
    spans.append(current)
    assert [hf.decode(s) for s in spans] == [MARKUP + "<|im_end|>", "It is \\boxed{42}.<|im_end|>"]
    # Every token before the first trained one is the rendered prompt, tools included.
    prompt = asyncio.run(chat.render(_with_tools_in_system(TWO_TURNS[:2]), None, True))
    assert record.token_ids[: record.prompt_length] == prompt


def _with_tools_in_system(messages: list[Message]) -> list[Message]:
    from envhub.tools.prompt import with_tools_in_system

    return with_tools_in_system(messages, [TOOL])  # SmolLM2's template ignores `tools`


class ForgetfulTemplate(ByteChatTokenizer):
    """Renders earlier assistant turns without their text once a later turn follows (as
    Qwen3's template drops old ``<think>`` blocks): the prefix rule breaks at turn 1."""

    def render_sync(self, messages: Any, tools: Any, add_generation_prompt: bool) -> list[int]:
        last = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
        shown = [
            m.model_copy(update={"content": ""}) if m.role == "assistant" and i < last else m
            for i, m in enumerate(messages)
        ]
        if add_generation_prompt and last >= 0:  # the next turn follows: the last is old too
            shown[last] = shown[last].model_copy(update={"content": ""})
        return super().render_sync(shown, tools, add_generation_prompt)


def test_a_template_that_rewrites_an_earlier_turn_is_reported_not_rendered() -> None:
    tok = ForgetfulTemplate()
    record = _render(tok, TWO_TURNS, end_ids=[tok.IM_END])
    assert not record.ok and record.token_ids == [] and record.loss_mask == []
    assert record.drift is not None and record.drift["turn"] == 1
    prompt = tok.render_sync(TWO_TURNS[:2], [TOOL], add_generation_prompt=True)
    # It parts where the first turn's text was: the rewritten rendering shows none of it.
    assert record.drift["position"] == len(prompt)
    assert record.drift["recorded"] == tok.encode(MARKUP)[:8]


def test_a_conversation_without_an_assistant_turn_is_refused() -> None:
    with pytest.raises(EnvhubError, match="no assistant turn"):
        _render(ByteChatTokenizer(), TWO_TURNS[:2])


def test_trailing_messages_after_the_last_turn_are_left_out() -> None:
    tok = ByteChatTokenizer()
    whole = _render(tok, TWO_TURNS, end_ids=[tok.IM_END])
    trailing = _render(tok, [*TWO_TURNS, user("Thanks!")], end_ids=[tok.IM_END])
    assert trailing == whole
    assert json.dumps(whole.loss_mask)  # plain lists, JSON-ready
