"""Single-turn procedural arithmetic at three difficulty levels: the CPU training quickstart.

Tasks are generated from ``(task_seed, index)`` (no download). Every answer is an exact
integer. The prompt is one short line, so even a 135M model sees little besides the problem.

- ``tiny``: ``a + b`` or ``a - b`` with single-digit operands, never negative (126 distinct
  problems);
- ``easy``: ``a + b`` or ``a - b`` with operands 1..99, never negative;
- ``medium``: three operands with ``+ - *`` (a factor of ``*`` is 2..12), never negative;
- ``hard``: 3-4 operations with parentheses, operands up to 999 (factors up to 99), values
  within ±100000 (bigger ones are redrawn: they test patience more than arithmetic).

Reward: 1.0 for the right answer plus 0.1 for giving it in ``\\boxed{}``. The answer must be a
number: math-verify would also accept the question's own expression (``\\boxed{99 + 68}``), and
a GRPO run on SmolLM2-135M learned exactly that within 15 steps; :func:`box_the_question` is
kept as the env's cheat, so the reward audit (:mod:`envhub.audit`) sees that it stays shut.
The 0.1 for the form alone is declared as ``audit_floor``: junk in a ``\\boxed{}`` earns it, and
nothing a degenerate policy writes may earn more.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from envhub.env import SingleTurnEnv
from envhub.envs.expressions import evaluate, format_number, make_problem
from envhub.envs.procedural import ProceduralTasks
from envhub.errors import EnvhubError
from envhub.rewards.format import has_answer
from envhub.rewards.match import number_answer
from envhub.rewards.rubric import Rubric
from envhub.types import Message


@dataclass(frozen=True)
class Level:
    """How problems of one difficulty are drawn."""

    operations: tuple[int, int]
    """Fewest and most operators per problem."""
    operators: str
    max_operand: int
    max_factor: int
    """Largest operand drawn for the right side of ``*``."""
    nested: bool
    """Nested expressions with parentheses (else a flat left-to-right chain)."""
    value_bounds: tuple[int, int]
    """Problems whose value falls outside these bounds are redrawn."""


LEVELS = {
    "tiny": Level(
        operations=(1, 1),
        operators="+-",
        max_operand=9,
        max_factor=0,
        nested=False,
        value_bounds=(0, 18),
    ),
    "easy": Level(
        operations=(1, 1),
        operators="+-",
        max_operand=99,
        max_factor=0,
        nested=False,
        value_bounds=(0, 198),
    ),
    "medium": Level(
        operations=(2, 2),
        operators="+-*",
        max_operand=99,
        max_factor=12,
        nested=False,
        value_bounds=(0, 100_000),
    ),
    "hard": Level(
        operations=(3, 4),
        operators="+-*",
        max_operand=999,
        max_factor=99,
        nested=True,
        value_bounds=(-100_000, 100_000),
    ),
}


def flat_problem(rng: random.Random, operations: int, level: Level) -> str:
    """``a op b [op c ...]`` without parentheses (usual precedence: ``*`` first)."""
    parts = [str(rng.randint(1, level.max_operand))]
    for _ in range(operations):
        op = rng.choice(level.operators)
        operand = (
            rng.randint(2, level.max_factor) if op == "*" else rng.randint(1, level.max_operand)
        )
        parts += [op, str(operand)]
    return " ".join(parts)


def draw_problem(rng: random.Random, level: Level) -> str:
    """One expression of ``level`` (redrawn until its value is allowed)."""
    while True:
        operations = rng.randint(*level.operations)
        if level.nested:
            expression = make_problem(
                rng, operations, level.max_operand, level.max_factor, level.operators
            )
        else:
            expression = flat_problem(rng, operations, level)
        low, high = level.value_bounds
        if low <= evaluate(expression) <= high:
            return expression


def problem_set(difficulty: str, size: int, seed: int) -> ProceduralTasks:
    """``size`` tasks of ``difficulty``, each a pure function of (difficulty, seed, index)."""
    level = LEVELS[difficulty]

    def make_task(rng: random.Random) -> dict[str, Any]:
        expression = draw_problem(rng, level)
        return {
            "question": f"What is {expression}?",
            "answer": format_number(evaluate(expression)),
            "info": {"expression": expression, "difficulty": difficulty},
        }

    return ProceduralTasks(f"arithmetic-{difficulty}", make_task, size, seed)


SYSTEM_PROMPT = "Solve the arithmetic problem. Give the final answer as \\boxed{NUMBER}."


class ArithmeticEnv(SingleTurnEnv):
    """Integer arithmetic (tiny/easy/medium/hard), answered in \\boxed{}.

    Args:
        difficulty: ``"tiny"`` (``a ± b``, single digits), ``"easy"`` (``a ± b``, two-digit
            operands), ``"medium"`` (three operands with ``+ - *``) or ``"hard"`` (3-4
            operations with parentheses, three-digit operands).
        num_tasks: Size of the generated task set.
        task_seed: Seed of the task generator (different seeds, different problems).
        **kwargs: See :class:`~envhub.env.TaskEnv` (``dataset``, ``rubric``,
            ``system_prompt``, ...).
    """

    name = "arithmetic"
    version = "0.1.0"
    system_prompt = SYSTEM_PROMPT
    default_max_turns = 1
    reward_range = (0.0, 1.1)
    pass_threshold = 1.0
    audit_floor = 0.1  # the format credit: any \boxed{} earns it, right or not
    levels = tuple(LEVELS)  # tiny, easy, medium, hard: a curriculum moves ``difficulty``
    level_arg = "difficulty"

    def __init__(
        self, difficulty: str = "easy", num_tasks: int = 1000, task_seed: int = 0, **kwargs: Any
    ) -> None:
        if difficulty not in LEVELS:
            raise EnvhubError(
                f"arithmetic: difficulty must be one of {', '.join(LEVELS)}, got {difficulty!r}"
            )
        self.difficulty, self.num_tasks, self.task_seed = difficulty, num_tasks, task_seed
        super().__init__(**kwargs)

    def load_dataset(self) -> ProceduralTasks:
        """``num_tasks`` problems of this difficulty, generated from ``task_seed``."""
        return problem_set(self.difficulty, self.num_tasks, self.task_seed)

    def default_rubric(self) -> Rubric:
        """1.0 for the right number (an expression does not count), 0.1 for a final answer."""
        return Rubric(
            [number_answer(weight=1.0, name="correct"), has_answer(weight=0.1, name="format")]
        )


_QUESTION = re.compile(r"What is (.+)\?\s*$")


def reference_policy(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
    """Solves every task: evaluates the question's expression and boxes the result."""
    question = next(m.content or "" for m in reversed(messages) if m.role == "user")
    match = _QUESTION.search(question)
    if match is None:
        return "I cannot read this problem."
    return f"\\boxed{{{format_number(evaluate(match.group(1)))}}}"


def box_the_question(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
    """The hack a GRPO run once learned: box the question's own expression, which math-verify
    evaluates and accepts (:func:`~envhub.rewards.match.number_answer` does not)."""
    question = next(m.content or "" for m in reversed(messages) if m.role == "user")
    match = _QUESTION.search(question)
    return f"\\boxed{{{match.group(1) if match else question}}}"


ArithmeticEnv.reference_policy = staticmethod(reference_policy)
ArithmeticEnv.cheats = {"box the question": box_the_question}
