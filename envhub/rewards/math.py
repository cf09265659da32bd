"""Math answer verification with ``math-verify`` (LaTeX, boxed answers, fractions, sets, units).

math-verify's own timeouts use ``signal.alarm``, which only works on the main thread. Off the
main thread they are disabled and the response is cut to its last ``max_chars`` characters
instead, which bounds the cost of parsing (the final answer is at the end).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from envhub.rewards.rubric import RewardFunction, reward

logging.getLogger("math_verify").setLevel(logging.ERROR)


def _timeouts() -> dict[str, Any]:
    on_main = threading.current_thread() is threading.main_thread()
    return {"parsing_timeout": 5 if on_main else None}


def _gold_text(answer: Any) -> str:
    text = str(answer).strip()
    if "$" in text or "\\boxed" in text:
        return text
    return f"${text}$"


def verify_math(response: str, answer: Any, max_chars: int = 2000) -> bool:
    """True when the final answer in ``response`` equals ``answer`` mathematically."""
    from math_verify import parse, verify

    if answer is None or not response:
        return False
    timeouts = _timeouts()
    gold = parse(_gold_text(answer), **timeouts)
    predicted = parse(response[-max_chars:], **timeouts)
    if not gold or not predicted:
        return False
    return bool(verify(gold, predicted, timeout_seconds=5 if timeouts["parsing_timeout"] else None))


def math_answer(weight: float = 1.0, name: str = "correct") -> RewardFunction:
    """1.0 when the last assistant message's final answer matches the task's ``answer``."""

    def correct(response: str, answer: Any) -> float:
        return float(verify_math(response, answer))

    return reward(correct, weight=weight, name=name)
