"""Sum two looked-up prices: an env written from scratch, with two tools and a reward.

No package, no ``name`` and no ``version``: envhub takes the file as it is, and names the env
after it (``lookup_sum``)::

    envhub check examples/envs/lookup_sum.py
    envhub list examples/envs/lookup_sum.py
    envhub eval examples/envs/lookup_sum.py:LookupSum -u http://127.0.0.1:8000/v1 -m MODEL
    envhub train --example quickstart envs.0.name=examples/envs/lookup_sum.py rollout.max_tokens=128

``solve`` is the reference policy: it shows ``envhub check`` that every task can be solved.
"""

from __future__ import annotations

import json
import re
from typing import Any

from envhub import Rubric, ToolEnv, reward, tool
from envhub.multiturn import TOOL_FORMAT_HINT

PRICES = {"apple": 3, "pear": 5, "plum": 7, "fig": 11}
TASKS = [
    {
        "question": f"What do one {a} and one {b} cost together?",
        "answer": str(PRICES[a] + PRICES[b]),
    }
    for a, b in [("apple", "pear"), ("plum", "fig"), ("pear", "fig")]
]


@tool(inline=True)
def lookup(item: str) -> int:
    """The price of one item.

    Args:
        item: The item, e.g. "apple".
    """
    return PRICES[item]


@tool(inline=True)
def add(a: int, b: int) -> int:
    """The sum of two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


@reward
def correct(response: str, answer: str) -> float:
    """1 when the reply ends with ``Answer: <the total>``."""
    found = re.findall(r"Answer:\s*(\d+)", response)
    return float(bool(found) and found[-1] == answer)


def solve(messages: list[Any], tools: Any) -> str:
    """Look both prices up, then add them (the reference policy)."""
    results = [m.content for m in messages if m.role == "tool"]
    if not results:
        question = next(m.content for m in messages if m.role == "user")
        items = re.findall(r"one (\w+)", question)
        calls = [{"name": "lookup", "arguments": {"item": item}} for item in items]
        return "\n".join(f"<tool_call>\n{json.dumps(c)}\n</tool_call>" for c in calls)
    if len(results) == 2:
        call = {"name": "add", "arguments": {"a": int(results[0]), "b": int(results[1])}}
        return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
    return f"Answer: {results[-1]}"


class LookupSum(ToolEnv):
    """Look up two prices and add them."""

    system_prompt = "Use the tools. " + TOOL_FORMAT_HINT + " End with `Answer: <number>`."
    tools = (lookup, add)
    default_max_turns = 4
    reward_range = (0.0, 1.0)
    reference_policy = staticmethod(solve)

    def load_dataset(self) -> list[dict[str, Any]]:
        """The three tasks above."""
        return TASKS

    def default_rubric(self) -> Rubric:
        """One reward: :func:`correct`."""
        return Rubric([correct])
