"""Check a chat template for the multi-turn exact-prefix property before training on it.

Token-exact multi-turn RL needs every turn's prompt to be an exact token prefix of the next
one. Some templates break this: they rewrite earlier assistant turns (dropping reasoning, as
Qwen3's does), re-render tool calls, or add text that depends on the position of a message.
The rollout runner detects and records such drift per episode; ``envhub doctor`` finds it up
front, on synthetic conversations, for any :class:`ChatTokenizer` (a vLLM server's, a local
one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from envhub.inference.base import ChatTokenizer
from envhub.rollout.tokens import common_prefix_length
from envhub.types import Message, assistant, system, tool_message, user

_TOOL = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}

CONVERSATIONS: dict[str, tuple[list[Message], list[dict[str, Any]] | None]] = {
    "plain multi-turn": (
        [
            system("You are terse."),
            user("Pick a number."),
            assistant("7"),
            user("Higher."),
            assistant("9"),
            user("Correct!"),
        ],
        None,
    ),
    "tool calls": (
        [
            user("What is 12 * 34?"),
            assistant(
                '<tool_call>\n{"name": "calculate", '
                '"arguments": {"expression": "12 * 34"}}\n</tool_call>'
            ),
            tool_message("408", "call_1", "calculate"),
            assistant("It is 408."),
            user("And plus 2?"),
        ],
        [_TOOL],
    ),
    "reasoning": (
        [
            user("2+2?"),
            assistant("<think>2 and 2 make 4.</think>4"),
            user("3+3?"),
            assistant("<think>Easy.</think>6"),
            user("ok"),
        ],
        None,
    ),
}


@dataclass(frozen=True)
class PrefixFinding:
    """One place where a turn's prompt is not a prefix of the next turn's."""

    conversation: str
    turn: int
    position: int
    expected: list[int]
    rendered: list[int]


async def check_prefix_property(
    tokenizer: ChatTokenizer, conversations: dict[str, Any] | None = None
) -> tuple[int, list[PrefixFinding]]:
    """Render each conversation turn by turn; report every turn whose prompt plus assistant
    turn is not an exact prefix of the next turn's prompt. Returns (turns checked, findings)."""
    findings, checked = [], 0
    for name, (messages, tools) in (conversations or CONVERSATIONS).items():
        turns = [i for i, m in enumerate(messages) if m.role == "assistant"]
        for number, index in enumerate(turns):
            if index + 1 >= len(messages):
                continue
            opened = await tokenizer.render(messages[:index], tools, add_generation_prompt=True)
            closed = await tokenizer.render(
                messages[: index + 1], tools, add_generation_prompt=False
            )
            following = await tokenizer.render(
                messages[: next_prompt_end(messages, index)], tools, add_generation_prompt=True
            )
            checked += 1
            # The generation prompt must open the turn as history renders it, and the history
            # must stay as it was once the env replies.
            for before, after in ((opened, closed), (closed, following)):
                at = common_prefix_length(before, after)
                if at < len(before):
                    findings.append(
                        PrefixFinding(name, number, at, before[at : at + 8], after[at : at + 8])
                    )
                    break
    return checked, findings


def next_prompt_end(messages: list[Message], index: int) -> int:
    """End of the env's reply that follows the assistant turn at ``index``."""
    end = index + 1
    while end < len(messages) and messages[end].role != "assistant":
        end += 1
    return end
