"""Exact-match rewards on extracted answers."""

from __future__ import annotations

import re
import unicodedata
from typing import Any

from envhub.rewards.rubric import RewardFunction, reward

_BOXED_OPEN = re.compile(r"\\boxed\{")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ANSWER_LINE = re.compile(r"(?im)^\s*(?:final\s+)?answer\s*[:：]\s*(.+?)\s*$")


def _boxed(text: str) -> list[str]:
    """Contents of every ``\\boxed{...}``, with braces nested to any depth (``\\frac{\\sqrt{3}}{2}``)."""
    found = []
    for match in _BOXED_OPEN.finditer(text):
        depth = 0
        for i in range(match.end() - 1, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                found.append(text[match.end() : i])
                break
    return found


def extract_answer(text: str) -> str | None:
    """The final answer in ``text``: the last ``\\boxed{}``, ``<answer>`` tag or ``Answer:`` line."""
    for find in (_boxed, _ANSWER_TAG.findall, _ANSWER_LINE.findall):
        found = find(text or "")
        if found:
            return found[-1].strip()
    return None


def normalize(text: str) -> str:
    """Case-fold, NFKC, collapse whitespace, drop surrounding punctuation and quotes."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = " ".join(text.split())
    return text.strip(" .,;:!?\"'`")


def exact_match(weight: float = 1.0, name: str = "exact_match", extract: bool = True) -> RewardFunction:
    """1.0 when the (extracted, normalised) response equals the normalised ``answer``.

    Args:
        extract: Compare the extracted final answer (see :func:`extract_answer`) rather than
            the whole response.
    """

    def matches(response: str, answer: Any) -> float:
        candidate = extract_answer(response) if extract else response
        if candidate is None or answer is None:
            return 0.0
        return float(normalize(candidate) == normalize(str(answer)))

    return reward(matches, weight=weight, name=name)
