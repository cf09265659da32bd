"""A multi-turn tool env: arithmetic too long to do in one's head, with a ``calculate`` tool.

Tasks are generated from the seed (no download): nested expressions of 3-5 operations on
numbers up to four digits. The model calls ``calculate`` as often as it likes, then answers
with ``\\boxed{...}``. Reward: 1 for the right number; tool validity is reported as a weight-0
component. The answer must be a number (:func:`~envhub.rewards.match.number_answer`): math-verify
evaluates expressions, so echoing the question ("Compute: 73 * (5349 + 6467)") scored 1.0
without a single tool call (the reward audit, :mod:`envhub.audit`, found it).
"""

from __future__ import annotations

import random
import re
from typing import Any

from envhub.envs.expressions import evaluate, format_number, make_problem
from envhub.envs.procedural import ProceduralTasks
from envhub.multiturn import TOOL_FORMAT_HINT, ToolEnv
from envhub.rewards.format import tool_call_validity
from envhub.rewards.match import number_answer
from envhub.rewards.rubric import Rubric
from envhub.tools.tool import tool
from envhub.types import Message


@tool(inline=True)
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: Numbers combined with + - * / and parentheses, e.g. "(1234 + 56) * 7".
    """
    return format_number(evaluate(expression))


def make_task(rng: random.Random) -> dict[str, Any]:
    """One calculator task: an expression of 3-5 operations on numbers up to four digits."""
    expression = make_problem(rng, rng.randint(3, 5))
    return {
        "question": f"Compute: {expression}",
        "answer": format_number(evaluate(expression)),
        "info": {"expression": expression},
    }


class ProblemSet(ProceduralTasks):
    """``size`` calculator problems, each a pure function of (seed, index)."""

    def __init__(self, size: int = 1000, seed: int = 0) -> None:
        super().__init__("calculator", make_task, size, seed)


SYSTEM_PROMPT = (
    "You are a careful assistant with a calculator. Use the `calculate` tool for arithmetic "
    "instead of computing in your head.\n\n" + TOOL_FORMAT_HINT + "\n\n"
    "When you know the result, reply without a tool call and give the final answer as "
    "\\boxed{NUMBER}."
)


class CalculatorEnv(ToolEnv):
    """Multi-turn arithmetic with a calculator tool.

    Args:
        num_tasks: Size of the generated task set.
        task_seed: Seed of the task generator (different seeds, different problems).
        **kwargs: See :class:`~envhub.multiturn.ToolEnv`.
    """

    name = "calculator"
    version = "0.1.0"
    system_prompt = SYSTEM_PROMPT
    default_max_turns = 6
    reward_range = (0.0, 1.0)
    tools = (calculate,)

    def __init__(self, num_tasks: int = 1000, task_seed: int = 0, **kwargs: Any) -> None:
        self.num_tasks, self.task_seed = num_tasks, task_seed
        super().__init__(**kwargs)

    def load_dataset(self) -> ProblemSet:
        """``num_tasks`` calculator problems, generated from ``task_seed``."""
        return ProblemSet(self.num_tasks, self.task_seed)

    def default_rubric(self) -> Rubric:
        """1.0 for the right number; tool-call validity is logged with weight 0."""
        return Rubric([number_answer(), tool_call_validity()])


_EXPRESSION = re.compile(r"Compute: (.+)$")


def reference_policy(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
    """Solves every task: one ``calculate`` call, then the boxed result."""
    last = messages[-1]
    if last.role == "tool":
        return f"The result is \\boxed{{{last.content}}}."
    question = next(m.content or "" for m in reversed(messages) if m.role == "user")
    match = _EXPRESSION.search(question)
    expression = match.group(1) if match else question
    call = f'{{"name": "calculate", "arguments": {{"expression": "{expression}"}}}}'
    return f"<tool_call>\n{call}\n</tool_call>"


CalculatorEnv.reference_policy = staticmethod(reference_policy)
