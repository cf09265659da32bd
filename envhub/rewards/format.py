"""Format rewards: did the model answer in the shape the env asked for?"""

from __future__ import annotations

import re
from collections.abc import Sequence

from envhub.rewards.match import extract_answer
from envhub.rewards.rubric import RewardFunction, reward
from envhub.state import State


def has_answer(weight: float = 0.1, name: str = "format") -> RewardFunction:
    """1.0 when the response contains an extractable final answer (boxed, tag or ``Answer:``)."""

    def formatted(response: str) -> float:
        return float(extract_answer(response) is not None)

    return reward(formatted, weight=weight, name=name)


def xml_tags(tags: Sequence[str], weight: float = 0.1, name: str = "xml_format") -> RewardFunction:
    """Fraction of ``tags`` that appear exactly once as a well-formed ``<tag>...</tag>`` pair."""
    patterns = [re.compile(rf"<{re.escape(t)}>.*?</{re.escape(t)}>", re.DOTALL) for t in tags]

    def well_formed(response: str) -> float:
        return sum(len(p.findall(response)) == 1 for p in patterns) / len(patterns)

    return reward(well_formed, weight=weight, name=name)


def tool_call_validity(weight: float = 0.0, name: str = "tool_validity") -> RewardFunction:
    """Per episode: the fraction of its tool calls that ran without error (1.0 if it made none).

    Weight 0 by default: reported as a component without changing the reward. Its mean over
    episodes counts an episode without calls as 1.0, so it is not the share of all calls that
    were valid (``EvalSummary.tool_validity``, the "valid tool calls" row of ``envhub eval``).
    """

    def validity(state: State) -> float:
        calls = state.metrics.get("tool_calls", 0)
        return 1.0 if calls == 0 else (calls - state.metrics.get("tool_errors", 0)) / calls

    return reward(validity, weight=weight, name=name)
