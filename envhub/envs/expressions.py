"""Arithmetic expressions: exact evaluation of expression text and random generation.

Shared by the ``calculator`` and ``arithmetic`` envs. Evaluation walks Python's AST and allows
numbers, ``+ - * /``, unary signs and parentheses only, so it is safe on model-written text.
"""

from __future__ import annotations

import ast
import operator
import random
from fractions import Fraction

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
_MAX_EXPRESSION = 200


def evaluate(expression: str) -> Fraction:
    """Exact value of an arithmetic expression (+ - * / and parentheses only)."""
    if len(expression) > _MAX_EXPRESSION:
        raise ValueError(f"expression longer than {_MAX_EXPRESSION} characters")
    tree = ast.parse(expression.replace("×", "*").replace("÷", "/").replace("−", "-"), mode="eval")
    return _eval(tree.body)


def _eval(node: ast.AST) -> Fraction:
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, (int, float))
        and not isinstance(node.value, bool)
    ):
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ZeroDivisionError("division by zero")
        return _BINARY[type(node.op)](left, right)
    raise ValueError(
        f"unsupported syntax: {ast.unparse(node)!r}; use numbers, + - * / and parentheses"
    )


def format_number(value: Fraction) -> str:
    """Integers as integers, other values as decimals rounded to 6 places."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.6f}".rstrip("0").rstrip(".")


def make_problem(
    rng: random.Random,
    operations: int,
    max_operand: int = 9999,
    max_multiplier: int = 99,
    operators: str = "+-*",
) -> str:
    """A random nested expression of ``operations`` operators, with minimal parentheses.

    Each step wraps the expression so far with a new operator and operand on a random side.
    Operands are ``2..max_operand``, except that a multiplication's operand is
    ``2..max_multiplier`` (which keeps products readable). Without ``/`` the value is an integer.
    """
    expression = str(rng.randint(2, max_operand))
    for _ in range(operations):
        op = rng.choice(operators)
        operand = rng.randint(2, max_multiplier) if op == "*" else rng.randint(2, max_operand)
        expression = (
            f"({expression}) {op} {operand}"
            if rng.random() < 0.5
            else f"{operand} {op} ({expression})"
        )
    return ast.unparse(ast.parse(expression, mode="eval"))
