"""The plain degenerate policies: replies that solve nothing, each a
:data:`~envhub.testing.Policy` ``(messages, tools) -> str``.

Like every audit policy they say the same thing whatever the env replies: echoing each reply
would play a game instead (guess-number's "6 guesses left" read as a guess of 6, then 5, ...).
"""

from __future__ import annotations

import re
from typing import Any

from envhub.env import Env
from envhub.testing import Policy
from envhub.tools.prompt import tool_call_block
from envhub.types import Message

JUNK = "junk"
"""What goes where an answer or a tool argument should be."""
FILLER = "filler"
"""The word ``longest`` repeats."""
LONGEST_TOKENS = 4096
"""Filler words per turn for ``longest`` when the env has no token budget."""
WORDS_PER_LINE = 16
"""``longest`` writes its filler as sentences of this many words, one a line, so that rewards
counting lines or sentences are tried as well as those counting words."""

_STANDARD_FORMATS = ("\\boxed{%s}", "<answer>%s</answer>", "Answer: %s")
# A tag pair shown in the prompt (`<guess>crane</guess>`), a `Label: <placeholder>` line in
# backticks, and a fenced block's language: the answer formats an env asks for in words.
_TAG_EXAMPLE = re.compile(r"<([A-Za-z][\w-]*)>[^<]*</\1>")
_LINE_TEMPLATE = re.compile(r"`([A-Za-z][\w ]{0,30}):\s*<[^<>`]+>`")
_FENCE_LANGUAGE = re.compile(r"```([A-Za-z][\w+-]*)")
NOT_ANSWER_TAGS = frozenset({"tool_call", "tools"})
"""The tool protocol's tags, covered by the tool-call policies, never an answer format."""
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_JUNK_VALUES: dict[str, Any] = {
    "string": JUNK,
    "integer": 0,
    "number": 0,
    "boolean": False,
    "array": [],
    "object": {},
    "null": None,
}


def shown_text(messages: list[Message]) -> str:
    """Everything the env has shown so far (system prompt, prompt, its replies), one text."""
    return "\n".join(m.content or "" for m in messages if m.role != "assistant")


def answer_formats(messages: list[Message]) -> list[str]:
    """Every answer format the env may read, as ``%s`` templates: the usual ones (boxed,
    ``<answer>`` tag, ``Answer:`` line) and those the prompt shows by example."""
    shown = shown_text(messages)
    formats = list(_STANDARD_FORMATS)
    for tag in dict.fromkeys(_TAG_EXAMPLE.findall(shown)):
        if tag.lower() not in NOT_ANSWER_TAGS:
            formats.append(f"<{tag}>%s</{tag}>")
    formats += [f"{label}: %s" for label in dict.fromkeys(_LINE_TEMPLATE.findall(shown))]
    formats += [f"```{lang}\n%s\n```" for lang in dict.fromkeys(_FENCE_LANGUAGE.findall(shown))]
    return list(dict.fromkeys(formats))


def in_every_format(messages: list[Message], content: str) -> str:
    """``content`` in every answer format of :func:`answer_formats`, one per line."""
    return "\n".join(f.replace("%s", content) for f in answer_formats(messages))


def echo_prompt(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
    """Repeats the prompt's last message (the question) every turn, whatever the env replied."""
    prompt = messages[: next((i for i, m in enumerate(messages) if m.role == "assistant"), None)]
    return (prompt[-1].content or "") if prompt else ""


def junk_in_format(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
    """Every answer format the env may read, with junk inside, one per line: the usual ones
    (boxed, ``<answer>`` tag, ``Answer:`` line) and those the prompt shows by example."""
    return in_every_format(messages, JUNK)


def tool_calls(tools: list[dict[str, Any]] | None, text: str = JUNK) -> str:
    """Calls every tool in ``tools`` once, string arguments ``text`` and the others junk of
    their schema's type; ``""`` when the env offers no tools."""
    calls = []
    for schema in tools or ():
        function = schema.get("function") or {}
        properties = (function.get("parameters") or {}).get("properties") or {}
        arguments = {name: junk_value(spec, text) for name, spec in properties.items()}
        calls.append(tool_call_block(function.get("name", ""), arguments))
    return "\n".join(calls)


def junk_tool_calls(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
    """Calls every tool in ``tools`` once, each argument junk of its schema's type; ``""``
    when the env offers no tools."""
    return tool_calls(tools)


def junk_value(spec: dict[str, Any], text: str = JUNK) -> Any:
    """A value that fits a JSON schema's type and means nothing: the first of an ``enum``,
    else ``text`` (``"junk"``), ``0``, ``false``, ``[]``, ``{}`` or ``null`` by type (``text``
    when the schema names no type)."""
    if spec.get("enum"):
        return spec["enum"][0]
    kind = spec.get("type", "string")
    if isinstance(kind, list):  # ["string", "null"]: the first type that is not null
        kind = next((k for k in kind if k != "null"), "null")
    return text if kind == "string" else _JUNK_VALUES.get(kind, text)


def filler(words: int) -> str:
    """``words`` filler words, written as sentences of :data:`WORDS_PER_LINE` words, one a line."""
    lines, left = [], words
    while left > 0:
        count = min(WORDS_PER_LINE, left)
        lines.append(" ".join([FILLER] * count) + ".")
        left -= count
    return "\n".join(lines)


def longest_output(env: Env) -> Policy:
    """A policy that fills ``env``'s remaining token budget (else :data:`LONGEST_TOKENS`) with
    filler words, every turn."""

    def fill(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
        budget = env.remaining_tokens
        return filler(LONGEST_TOKENS if budget is None else budget)

    return fill


def shortest(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
    """The shortest reply that is not empty (the empty one is ``check_env``'s): one dot."""
    return "."


def question_numbers(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
    """Every number in the question (the first user message), in order, separated by spaces."""
    question = next((m.content or "" for m in messages if m.role == "user"), "")
    return " ".join(_NUMBER.findall(question))


def everything(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
    """Echo, numbers, junk formats and junk tool calls in one reply."""
    parts = (echo_prompt, question_numbers, junk_in_format, junk_tool_calls)
    return "\n\n".join(p for p in (part(messages, tools) for part in parts) if p)


DONT_KNOW = "I don't know"
"""What ``abstain-in-format`` puts in every answer format."""
ABSTENTION = f"{DONT_KNOW}. I am not able to answer this with confidence."
"""What the ``abstain`` policy says."""


def abstain(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
    """A plain refusal: :data:`ABSTENTION`."""
    return ABSTENTION


def abstain_in_format(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
    """ "I don't know" in every answer format (``\\boxed{I don't know}``, ``Answer: I don't
    know``, ...), after the plain refusal."""
    return f"{ABSTENTION}\n{in_every_format(messages, DONT_KNOW)}"
