"""An LLM judge over any OpenAI-compatible endpoint.

The judge sees the question, the reference answer and the response, and answers ``yes`` or
``no`` (or a 0-10 score with ``scale=10``). Its verdict is parsed strictly: an answer that is
neither raises, which the rubric records as an error on the episode (score 0), never as a pass.
"""

from __future__ import annotations

import re
from typing import Any

from envhub.inference.base import GenerateRequest, SamplingParams
from envhub.inference.openai_http import OpenAIEngine
from envhub.rewards.rubric import RewardFunction, reward
from envhub.types import Message, system, user

DEFAULT_TEMPLATE = """Question:
{question}

Reference answer:
{answer}

Response to grade:
{response}

Does the response answer the question correctly, in agreement with the reference answer? \
Reply with exactly one word: yes or no."""

SCORE_TEMPLATE = """Question:
{question}

Reference answer:
{answer}

Response to grade:
{response}

Grade the response from 0 (wrong) to {scale} (fully correct and complete). \
Reply with the number only."""


def _question(prompt: list[Message]) -> str:
    return next((m.content or "" for m in reversed(prompt) if m.role == "user"), "")


def parse_verdict(text: str, scale: int | None) -> float:
    """``yes``/``no`` -> 1/0, or a number in ``0..scale`` -> fraction; anything else raises."""
    cleaned = text.strip().lower()
    if scale is None:
        word = re.match(r"^\W*(yes|no)\b", cleaned)
        if not word:
            raise ValueError(f"judge answered {text[:80]!r}, expected yes or no")
        return 1.0 if word.group(1) == "yes" else 0.0
    # A sign or a leading point is part of the number: "-3" and ".5" must not read as 3 and 5.
    number = re.match(r"^[^\w.\-−]*(\d+(?:\.\d+)?)", cleaned)
    if not number or not 0 <= float(number.group(1)) <= scale:
        raise ValueError(f"judge answered {text[:80]!r}, expected a number from 0 to {scale}")
    return float(number.group(1)) / scale


def judge_reward(
    base_url: str,
    model: str | None = None,
    *,
    api_key: str | None = None,
    template: str | None = None,
    scale: int | None = None,
    weight: float = 1.0,
    name: str = "judge",
    engine: OpenAIEngine | None = None,
) -> RewardFunction:
    """A reward that asks a judge model whether the response is right.

    Args:
        base_url: The judge's OpenAI-compatible server.
        model: Judge model name (``None``: the server's first model).
        template: Prompt with ``{question}``, ``{answer}``, ``{response}`` (and ``{scale}``).
        scale: ``None`` for a yes/no verdict, else the top of a 0..scale score.
        engine: Reuse an existing engine instead of opening a new connection.
    """
    judge = engine or OpenAIEngine(
        base_url, model, api_key=api_key, mode="chat", max_concurrency=16
    )
    text = template or (DEFAULT_TEMPLATE if scale is None else SCORE_TEMPLATE)
    sampling = SamplingParams(temperature=0.0, max_tokens=8, logprobs=False)

    async def judged(prompt: list[Message], response: str, answer: Any) -> float:
        content = text.format(
            question=_question(prompt), answer=answer, response=response, scale=scale
        )
        messages = [system("You are a strict grader."), user(content)]
        generation = await judge.generate(GenerateRequest(messages=messages, sampling=sampling))
        return parse_verdict(generation.text, scale)

    return reward(judged, weight=weight, name=name)
