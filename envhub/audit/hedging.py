"""Replies that do not commit to one answer: every option the prompt offers, every small number
and the question's own numbers, listed in every answer format, and a range that holds them all.

The list is wrapped in ``junk`` and :data:`SENTINEL` on both sides, so a reward that reads the
first or the last item of a list, or its first or last number (fair ways to force a commitment),
reads junk or a number no task has; only a reward that looks for the answer anywhere in the list
is paid. The reference-based hedges (the right
answer among wrong ones) are in :mod:`envhub.audit.mutation`.
"""

from __future__ import annotations

import re
from typing import Any

from envhub.audit.basic import JUNK, in_every_format, shown_text
from envhub.types import Message

SENTINEL = "987654321"
"""Opens and closes every list of candidates: an answer no task has."""
SWEEP = range(0, 101)
"""The small whole numbers every candidate list includes."""
OPTION_LETTERS = ("A", "B", "C", "D", "E")
BINARY_OPTIONS = ("yes", "no", "true", "false")

# `left`, `down`: single words in backticks; "a, b or c" and "a or b": the options of a choice.
_BACKTICKED_WORD = re.compile(r"`([A-Za-z][\w-]{0,20})`")
_OR_LIST = re.compile(r"\b((?:[A-Za-z][\w-]*,\s+)*[A-Za-z][\w-]*,?\s+or\s+[A-Za-z][\w-]*)\b")
_LISTED = re.compile(r"(?i)\b(?:actions?|options?|choices?|moves?)\s*:\s*([\w-]+(?:,\s*[\w-]+)+)")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_STOPWORDS = frozenset({"and", "or", "the", "a", "an", "to", "of", "in", "is", "it", "not"})


def prompt_options(messages: list[Message]) -> list[str]:
    """The options a prompt offers by name: words in backticks, ``a, b or c`` lists and
    ``Actions: a, b, c`` lines, in order of appearance, without repeats."""
    shown = shown_text(messages)
    found = list(_BACKTICKED_WORD.findall(shown))
    for listed in _OR_LIST.findall(shown) + _LISTED.findall(shown):
        found += re.split(r",?\s+or\s+|,\s*", listed)
    words = [w.strip() for w in found if w.strip() and w.strip().lower() not in _STOPWORDS]
    return list(dict.fromkeys(words))


def candidates(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
    """Every candidate at once, in every answer format: the prompt's options, yes/no/true/false,
    option letters, the question's numbers and 0..100, between ``junk`` and :data:`SENTINEL`
    on both sides; then a
    range that holds every number (``between -987654321 and 987654321``), in every format."""
    question = next((m.content or "" for m in messages if m.role == "user"), "")
    items = [
        *prompt_options(messages),
        *BINARY_OPTIONS,
        *OPTION_LETTERS,
        *_NUMBER.findall(question),
        *map(str, SWEEP),
    ]
    listed = ", ".join([JUNK, SENTINEL, *dict.fromkeys(items), SENTINEL, JUNK])
    every = f"between -{SENTINEL} and {SENTINEL}"
    return f"{in_every_format(messages, listed)}\n{in_every_format(messages, every)}"
