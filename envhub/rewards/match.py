"""Exact-match rewards on extracted answers."""

from __future__ import annotations

import re
import unicodedata
from typing import Any

from envhub.rewards.rubric import RewardFunction, reward

_BOXED_OPEN = re.compile(r"\\boxed\{")
_BRACE = re.compile(r"[{}]")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# Greedy capture, stripped by the caller, and no newline before "answer": a lazy capture and a
# leading \s* that crossed lines both backtracked quadratically over long runs of whitespace.
_ANSWER_LINE = re.compile(r"(?im)^[^\S\n]*(?:final\s+)?answer\s*[:：]\s*(.+)$")
_NUMBER = re.compile(r"[-+−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_NUMBER_ONLY = re.compile(rf"\$?\s*({_NUMBER.pattern})\s*\$?\.?")


def _boxed(text: str) -> list[str]:
    """Contents of every ``\\boxed{...}``, braces nested to any depth (``\\frac{\\sqrt{3}}{2}``).

    One pass over the braces: rescanning the text from each ``\\boxed{`` took quadratic time
    on a response full of unclosed ones (50 s for 10,000 of them).
    """
    box_braces = {match.end() - 1 for match in _BOXED_OPEN.finditer(text)}
    found, open_boxes, depth = [], [], 0  # open_boxes: (depth outside its brace, content start)
    for brace in _BRACE.finditer(text):
        i = brace.start()
        if text[i] == "{":
            if i in box_braces:
                open_boxes.append((depth, i + 1))
            depth += 1
            continue
        depth -= 1
        if open_boxes and open_boxes[-1][0] == depth:
            start = open_boxes.pop()[1]
            found.append((start, text[start:i]))
    return [content for _, content in sorted(found)]


def _answer_tags(text: str) -> list[str]:
    """Contents of every ``<answer>...</answer>``; the search stops at the last ``</answer>``,
    since a search from each unclosed tag to the end of the text was quadratic."""
    end = text.rfind("</answer>")
    return _ANSWER_TAG.findall(text, 0, end + len("</answer>")) if end >= 0 else []


def extract_answer(text: str) -> str | None:
    """The final answer in ``text``: the last ``\\boxed{}``, ``<answer>`` tag or ``Answer:`` line.

    Returns ``None`` when ``text`` has none of them.
    """
    for find in (_boxed, _answer_tags, _ANSWER_LINE.findall):
        found = find(text or "")
        if found:
            return found[-1].strip()
    return None


def normalize(text: str) -> str:
    """Case-fold, NFKC, collapse whitespace, drop surrounding punctuation and quotes."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = " ".join(text.split())
    return text.strip(" .,;:!?\"'`")


def exact_match(
    weight: float = 1.0, name: str = "exact_match", extract: bool = True
) -> RewardFunction:
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


def parse_number(text: str) -> float | None:
    """The value of ``text`` when it is one number literal (``42``, ``-3.5``, ``1,000``, ``$7$``),
    else ``None``: an expression such as ``99 + 68`` is not a number."""
    match = _NUMBER_ONLY.fullmatch(text.strip())
    if match is None:
        return None
    return float(match.group(1).replace(",", "").replace("−", "-"))


def final_number(text: str) -> float | None:
    """The response's final answer as a number: the extracted answer (:func:`extract_answer`)
    when there is one, else the last number in the text."""
    extracted = extract_answer(text or "")
    if extracted is not None:
        return parse_number(extracted)
    numbers = _NUMBER.findall(text or "")
    return parse_number(numbers[-1]) if numbers else None


def number_answer(
    weight: float = 1.0, name: str = "correct", tolerance: float = 1e-9
) -> RewardFunction:
    """1.0 when the final answer is a number equal to ``answer`` (within ``tolerance``).

    Stricter than :func:`~envhub.rewards.math.math_answer`, which evaluates expressions: where
    computing the value is the task (arithmetic), a policy would otherwise learn to box the
    question itself (``\\boxed{99 + 68}``) and be paid for it.
    """

    def correct(response: str, answer: Any) -> float:
        value, gold = (
            final_number(response),
            parse_number(str(answer)) if answer is not None else None,
        )
        if value is None or gold is None:
            return 0.0
        return float(abs(value - gold) <= tolerance * max(1.0, abs(gold)))

    return reward(correct, weight=weight, name=name)
