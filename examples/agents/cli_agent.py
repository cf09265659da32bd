#!/usr/bin/env python3
"""A small command-line agent: a chat-completions tool loop with one ``calculate`` tool.

It reads the task from stdin, asks the model (``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and
``OPENAI_MODEL`` from the environment, as a harness env's endpoint sets them), runs each
``calculate`` call itself (arithmetic only, read with ``ast``; nothing is ``eval``-ed) and sends
the results back, until the model answers without a tool call; that answer is printed on stdout.

Run it as a harness program (the task on stdin, its stdout the episode's result)::

    HarnessEnv(CommandProgram([sys.executable, "examples/agents/cli_agent.py"]), tasks, ...)

or by hand, against any OpenAI-compatible server::

    echo "What is 17 * 23 + 4?" | OPENAI_MODEL=gpt-4o-mini python examples/agents/cli_agent.py

(there, api.openai.com's), or a local one::

    envhub serve-model smollm2-135m    # then, in another terminal:
    export OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=none OPENAI_MODEL=smollm2-135m
    echo "What is 17 * 23 + 4?" | python examples/agents/cli_agent.py

After ``--max-calls`` calls without an answer it stops, prints nothing on stdout and exits 0:
running out of calls is the model's failure (scored as a wrong answer), not the program's. Only
``openai`` is needed.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import operator
import os
import sys
from collections.abc import Callable
from typing import Any

from openai import OpenAI

SYSTEM_PROMPT = (
    "You solve the user's task. Use the calculate tool for any arithmetic, then state the "
    "final answer."
)

CALCULATE_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression: numbers, + - * / // % ** and brackets.",
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {"type": "string", "description": "For example (17 * 23) + 4"}
            },
            "required": ["expression"],
        },
    },
}

BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}

MAX_BITS = 4096
"""The largest integer (in bits) an expression may produce: ``9 ** 9 ** 9`` is refused, not run."""
MAX_EXPRESSION = 1000
"""The longest expression read, in characters."""


class CalculationError(ValueError):
    """An expression that is not plain arithmetic, or whose value is out of bounds."""


def calculate(expression: str) -> str:
    """The value of an arithmetic expression as text (``"395"``, ``"2.5"``), or ``"error: ..."``
    saying why it has none; integral floats are written as integers (``"6"`` for ``12 / 2``)."""
    try:
        value = evaluate(expression)
    except CalculationError as e:
        return f"error: {e}"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def evaluate(expression: str) -> int | float:
    """The number an arithmetic expression stands for.

    Raises:
        CalculationError: Not arithmetic (names, calls, strings, ...), a syntax error, a division
            by zero, a result over :data:`MAX_BITS` (or not a finite real number), or an expression
            over :data:`MAX_EXPRESSION` characters or nested too deeply.
    """
    if len(expression) > MAX_EXPRESSION:
        raise CalculationError(f"the expression is over {MAX_EXPRESSION} characters")
    try:
        return _value(ast.parse(expression.strip(), mode="eval").body)
    except SyntaxError as e:
        raise CalculationError(f"not an expression ({e.msg})") from None
    except (RecursionError, MemoryError):
        raise CalculationError("the expression is nested too deeply") from None


def _value(node: ast.AST) -> int | float:
    """Evaluate one node of an arithmetic expression's tree."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
        return UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        try:
            result = BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise CalculationError("division by zero") from None
        except OverflowError:
            raise CalculationError("the result is too large") from None
        if isinstance(result, complex):
            raise CalculationError("the result is not a real number")
        if isinstance(result, int) and result.bit_length() > MAX_BITS:
            raise CalculationError("the result is too large")
        if isinstance(result, float) and not math.isfinite(result):
            raise CalculationError("the result is too large")
        return result
    raise CalculationError(f"{ast.unparse(node)!r} is not arithmetic")


def _check_power(base: int | float, exponent: int | float) -> None:
    """Refuse an integer power whose result would be over :data:`MAX_BITS` before computing it."""
    if isinstance(base, int) and isinstance(exponent, int) and abs(base) > 1:
        if exponent * (abs(base).bit_length() - 1) > MAX_BITS:
            raise CalculationError("the result is too large")


def run_tool(name: str, arguments: str) -> str:
    """The result of one tool call, as the text sent back to the model."""
    if name != "calculate":
        return f"error: unknown tool {name!r}; the only tool is calculate"
    try:
        expression = json.loads(arguments)["expression"]
    except (ValueError, TypeError, KeyError):
        return 'error: the arguments must be a JSON object like {"expression": "1 + 2"}'
    if not isinstance(expression, str):
        return "error: expression must be a string"
    return calculate(expression)


def solve(client: OpenAI, model: str, task: str, max_calls: int) -> str | None:
    """Run the tool loop on ``task``: the model's final answer, or ``None`` when it still had not
    answered after ``max_calls`` calls."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task},
    ]
    for _ in range(max_calls):
        response = client.chat.completions.create(
            model=model, messages=messages, tools=[CALCULATE_TOOL]
        )
        message = response.choices[0].message
        if not message.tool_calls:
            return (message.content or "").strip()
        messages.append(
            {
                "role": "assistant",
                "content": message.content,
                "tool_calls": [c.model_dump(exclude_none=True) for c in message.tool_calls],
            }
        )
        for call in message.tool_calls:
            result = run_tool(call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return None


def main(argv: list[str] | None = None) -> int:
    """Read the task from stdin, solve it, print the answer; the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-calls", type=int, default=8, help="model calls at most")
    parser.add_argument(
        "--max-retries",
        type=int,
        default=0,
        help="retries of a failed call (default 0: under a harness, a retry would re-send a "
        "call the policy may have answered)",
    )
    args = parser.parse_args(argv)
    task = sys.stdin.read().strip()
    if not task:
        parser.error("the task is read from stdin, which was empty")
    client = OpenAI(
        base_url=os.environ.get("OPENAI_BASE_URL"),
        api_key=os.environ.get("OPENAI_API_KEY"),
        max_retries=args.max_retries,
    )
    answer = solve(client, os.environ.get("OPENAI_MODEL", "gpt-4o-mini"), task, args.max_calls)
    if answer is None:
        print(f"no final answer after {args.max_calls} calls", file=sys.stderr)
        return 0
    print(answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
