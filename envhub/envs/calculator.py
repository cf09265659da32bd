"""A multi-turn tool env: arithmetic too long to do in one's head, with a ``calculate`` tool.

Tasks are generated from the seed (no download): nested expressions of 3-5 operations on
numbers up to four digits. The model calls ``calculate`` as often as it likes, then answers
with ``\\boxed{...}``. Reward: 1 for the right answer (math-verify); tool validity is reported
as a weight-0 component.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from fractions import Fraction
from typing import Any

from envhub.multiturn import TOOL_FORMAT_HINT, ToolEnv
from envhub.rewards.format import tool_call_validity
from envhub.rewards.math import math_answer
from envhub.rewards.rubric import Rubric
from envhub.tools.tool import tool
from envhub.types import Message

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_MAX_EXPRESSION = 200


def evaluate(expression: str) -> Fraction:
    """Exact value of an arithmetic expression (+ - * / and parentheses only)."""
    if len(expression) > _MAX_EXPRESSION:
        raise ValueError(f"expression longer than {_MAX_EXPRESSION} characters")
    tree = ast.parse(expression.replace("×", "*").replace("÷", "/").replace("−", "-"), mode="eval")
    return _eval(tree.body)


def _eval(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ZeroDivisionError("division by zero")
        return _BINARY[type(node.op)](left, right)
    raise ValueError(f"unsupported syntax: {ast.unparse(node)!r}; use numbers, + - * / and parentheses")


def format_number(value: Fraction) -> str:
    """Integers as integers, other values as decimals rounded to 6 places."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.6f}".rstrip("0").rstrip(".")


@tool(inline=True)
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: Numbers combined with + - * / and parentheses, e.g. "(1234 + 56) * 7".
    """
    return format_number(evaluate(expression))


def make_problem(rng: random.Random, operations: int) -> str:
    """A random expression of ``operations`` operators (+ - *, so its value is an integer)."""
    expression = str(rng.randint(2, 9999))
    for _ in range(operations):
        op = rng.choice("+-*")
        operand = rng.randint(2, 99) if op == "*" else rng.randint(2, 9999)
        expression = f"({expression}) {op} {operand}" if rng.random() < 0.5 else f"{operand} {op} ({expression})"
    return ast.unparse(ast.parse(expression, mode="eval"))  # minimal parentheses


class ProblemSet:
    """``size`` problems, each a pure function of (seed, index)."""

    def __init__(self, size: int = 1000, seed: int = 0) -> None:
        self.size, self.seed = size, seed

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not 0 <= index < self.size:
            raise IndexError(index)
        rng = random.Random(f"calculator-{self.seed}-{index}")
        expression = make_problem(rng, rng.randint(3, 5))
        return {
            "question": f"Compute: {expression}",
            "answer": format_number(evaluate(expression)),
            "info": {"expression": expression},
        }


SYSTEM_PROMPT = (
    "You are a careful assistant with a calculator. Use the `calculate` tool for arithmetic "
    "instead of computing in your head.\n\n" + TOOL_FORMAT_HINT + "\n\n"
    "When you know the result, reply without a tool call and give the final answer as \\boxed{NUMBER}."
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
        return ProblemSet(self.num_tasks, self.task_seed)

    def default_rubric(self) -> Rubric:
        return Rubric([math_answer(), tool_call_validity()])


_EXPRESSION = re.compile(r"Compute: (.+)$")


def reference_policy(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
    """Solves every task: one ``calculate`` call, then the boxed result."""
    last = messages[-1]
    if last.role == "tool":
        return f"The result is \\boxed{{{last.content}}}."
    question = next(m.content or "" for m in reversed(messages) if m.role == "user")
    match = _EXPRESSION.search(question)
    expression = match.group(1) if match else question
    return f'<tool_call>\n{{"name": "calculate", "arguments": {{"expression": "{expression}"}}}}\n</tool_call>'


CalculatorEnv.reference_policy = staticmethod(reference_policy)
