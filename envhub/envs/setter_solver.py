"""``setter-solver``: one role writes an arithmetic problem, another solves it: a curriculum
the policy writes for itself.

An episode: the ``setter`` writes an integer expression (``+ - *``, parentheses) inside
``<problem>...</problem>`` (without the tag, the last expression in its reply:
:func:`read_problem`); the env computes its value exactly. Then ``attempts`` solvers
(``solver#0`` .. ``solver#{k-1}``, each a fresh conversation seeing only the problem) answer
it, each unaware of the others (so the runner samples them together: :attr:`Match.upcoming
<envhub.roles.Match.upcoming>`). Rewards:

- a solver: 1.0 when its final number (the last ``\\boxed{}``, else the last number) equals
  the value, else 0.0;
- the setter: with ``p`` = the share of the ``attempts`` solvers that solved it (the solve rate
  of the problem's group of solver samples), :func:`setter_reward` pays 1.0 when
  ``band[0] <= p <= band[1]`` (the default band is 0.25-0.75: solved sometimes, not always) and
  0.0 outside it, or with ``nudge`` > 0 up to ``nudge`` toward the band: a too-easy problem
  earns ``nudge`` x its size, a too-hard one ``nudge`` x (1 - its size) (:func:`problem_size`),
  so that two problems outside the band on the same side no longer tie;
- an invalid problem (no expression, a character other than digits, spaces, ``+ - * ( )``,
  more than ``max_operations`` operations, or a value over ``max_value`` in size) pays the
  setter ``-1.0`` (result ``invalid``) and ends the episode before any solver plays.

The solvers' attempts are one training group (the same problem, the same role: their actor
ids carry a seat, ``solver#i``, see :attr:`~envhub.types.Trajectory.group_key`); the setters of
a task's samples are another. Fixed policies: ``random`` (a setter drawing a random problem of
the asked size), ``oracle`` (a solver that computes the answer) and ``student`` (a solver of
known skill, right more often the smaller the problem: :func:`student_solver`), against which a
trained setter can be checked for finding the band without a solver that learns beside it.
"""

from __future__ import annotations

import math
import random
import re
from typing import Any, ClassVar

import numpy as np

from envhub.envs.expressions import evaluate
from envhub.rewards.match import final_number
from envhub.roles import Match, MultiRoleEnv
from envhub.types import AssistantTurn, Message, system, user

DEFAULT_BAND = (0.25, 0.75)
DEFAULT_MAX_OPERATIONS = 6
DEFAULT_MAX_VALUE = 10**6
INVALID_PENALTY = -1.0
RANDOM_SETTER_MAX = DEFAULT_MAX_VALUE
"""The largest value the ``random`` setter writes (the default ``max_value``)."""
_PROBLEM_TAG = re.compile(r"<problem>(.*?)</problem>", re.DOTALL)
_ALLOWED = re.compile(r"[\d\s+\-*()]+")
_OPERATOR = re.compile(r"(?<=[\d)\s])\s*[+\-*]")
_RUN = re.compile(r"[\d(][\d \t+\-*()]*[\d)]|\d")
_BINARY_OP = re.compile(r"[\d)]\s*[+\-*]\s*[\d(]")
_ASK = re.compile(r"about (\d+) operations? on (\d+)-digit")

SETTER_PROMPT = (
    "You write arithmetic problems for a student. Write one expression with about {operations} "
    "operations on {digits}-digit whole numbers, using only + - * and parentheses. Make it hard "
    "enough that the student sometimes gets it wrong, but not always. Reply with the expression "
    "inside <problem></problem>, for example <problem>(12 + 7) * 3</problem>."
)
STUDENT_SKILL = 0.4
"""The problem size the ``student`` solver gets right half the time."""
STUDENT_SLOPE = 0.05
"""How sharply the ``student``'s success falls with size around its skill."""
SOLVER_PROMPT = "Solve the arithmetic problem. Give the final answer as \\boxed{NUMBER}."


def setter_reward(solve_rate: float, band: tuple[float, float] = DEFAULT_BAND) -> float:
    """The setter's reward for a valid problem solved by a share ``solve_rate`` of its
    solvers: 1.0 inside ``band`` (both ends included), 0.0 outside it."""
    low, high = band
    return 1.0 if low - 1e-12 <= solve_rate <= high + 1e-12 else 0.0


def count_operations(expression: str) -> int:
    """The operators (``+ - *``) in an expression that follow a digit, a closing parenthesis
    or a space (so a minus sign at its start is not counted)."""
    return len(_OPERATOR.findall(expression))


def problem_size(problem: str, value: int, max_operations: int, max_value: int) -> float:
    """How big a valid problem is, in [0, 1]: the mean of its share of ``max_operations`` and
    its value's digits' share of ``max_value``'s (``(12 + 7) * 3``: 2 of 6 operations, 2 of 7
    digits under 10**6). A proxy for hardness that needs no solver."""
    operations = count_operations(problem) / max_operations
    digits = len(str(abs(value))) / len(str(max_value))
    return (min(operations, 1.0) + min(digits, 1.0)) / 2


def nudged_reward(rate: float, size: float, band: tuple[float, float], nudge: float) -> float:
    """The setter's reward with a nudge toward the band: :func:`setter_reward` inside it;
    outside, ``nudge`` x ``size`` when the problem was too easy (bigger is nearer the band),
    ``nudge`` x (1 - ``size``) when too hard (smaller is nearer)."""
    paid = setter_reward(rate, band)
    if paid or not nudge:
        return paid
    return nudge * (size if rate > band[1] else 1.0 - size)


def read_problem(text: str, max_operations: int, max_value: int) -> tuple[str, int]:
    """The problem a setter's reply poses and its exact value.

    The expression is the last ``<problem>`` tag's content; without a tag, the last stretch of
    the reply made of digits, spaces, ``+ - *`` and parentheses that holds an operation between
    two numbers (``What is 6 + 2 * 2?`` poses ``6 + 2 * 2``; ``12 + 7 = 20`` poses ``12 + 7``).

    Raises:
        ValueError: Why the problem is invalid (see the module doc).
    """
    tags = _PROBLEM_TAG.findall(text)
    if tags:
        expression = tags[-1].strip()
    else:
        runs = [m.group().strip() for m in _RUN.finditer(text) if _BINARY_OP.search(m.group())]
        expression = runs[-1] if runs else ""
    if not expression:
        raise ValueError("no problem written")
    if not _ALLOWED.fullmatch(expression):
        raise ValueError(f"only digits, spaces, + - * and parentheses are allowed: {expression!r}")
    operations = count_operations(expression)
    if operations == 0:
        raise ValueError("the problem has no operation")
    if operations > max_operations:
        raise ValueError(f"{operations} operations; at most {max_operations}")
    try:
        value = evaluate(expression)
    except (SyntaxError, ValueError, ZeroDivisionError) as e:
        raise ValueError(f"cannot evaluate {expression!r}: {e}") from e
    if abs(value) > max_value:
        raise ValueError(f"the value {value} is larger than {max_value}")
    return expression, int(value)


def random_setter(messages: list[Message], rng: np.random.Generator) -> str:
    """A fixed setter: a random problem of the size the prompt asks for."""
    asked = _ASK.search(next(m.content or "" for m in messages if m.role == "system"))
    operations, digits = (int(asked.group(1)), int(asked.group(2))) if asked else (2, 1)
    draw = random.Random(int(rng.integers(2**31)))
    for attempt in range(20):  # products of big numbers overflow the default max_value
        numbers = [draw.randint(10 ** (digits - 1), 10**digits - 1) for _ in range(operations + 1)]
        signs = "+-*" if attempt < 19 else "+-"
        text = str(numbers[0]) + "".join(f" {draw.choice(signs)} {n}" for n in numbers[1:])
        if abs(evaluate(text)) <= RANDOM_SETTER_MAX:
            break
    return f"<problem>{text}</problem>"


def oracle_solver(messages: list[Message], rng: np.random.Generator) -> str:
    """A fixed solver that computes the answer."""
    problem = next(m.content or "" for m in reversed(messages) if m.role == "user")
    return f"\\boxed{{{int(evaluate(problem))}}}"


def student_solve_probability(size: float) -> float:
    """The ``student`` solver's chance on a problem of :func:`problem_size` ``size``:
    ``1 / (1 + exp((size - STUDENT_SKILL) / STUDENT_SLOPE))``: 0.88 at size 0.3, 0.5 at 0.4,
    0.12 at 0.5."""
    return 1.0 / (1.0 + math.exp((size - STUDENT_SKILL) / STUDENT_SLOPE))


def student_solver(messages: list[Message], rng: np.random.Generator) -> str:
    """A fixed solver of known skill: right with :func:`student_solve_probability` of the
    problem's size (under the default limits: 6 operations, values up to 10**6), else off by
    1-9. Its solve rates fall in the default band for problems of size about 0.35-0.45 (two or
    three operations on a value of three or four digits)."""
    problem = next(m.content or "" for m in reversed(messages) if m.role == "user")
    value = int(evaluate(problem))
    size = problem_size(problem, value, DEFAULT_MAX_OPERATIONS, DEFAULT_MAX_VALUE)
    if rng.random() < student_solve_probability(size):
        return f"\\boxed{{{value}}}"
    return f"\\boxed{{{value + int(rng.integers(1, 10))}}}"


def setter_tasks() -> list[dict[str, Any]]:
    """What the setter is asked for: 1-4 operations on 1-3-digit numbers (12 tasks)."""
    return [{"operations": n, "digits": d} for n in range(1, 5) for d in range(1, 4)]


class SetterSolverEnv(MultiRoleEnv):
    """Self-play: a setter writes arithmetic problems, paid when its solvers solve them sometimes.

    ``attempts`` solvers answer each problem (see the module doc).

    Args:
        attempts: Solver attempts per problem (the solver group's size).
        band: The solve rates, ``(low, high)`` inclusive, for which the setter is paid.
        max_operations: The most operations a valid problem may have.
        max_value: The largest size of a valid problem's value.
        nudge: Outside the band, pay the setter up to this much for a problem whose size lies
            toward the band (:func:`nudged_reward`; 0, the default: nothing outside the band).
        policies: Fixed policies by role (``{"setter": "random"}`` trains the solver only).
    """

    name = "setter-solver"
    version = "0.1.0"
    roles = ("setter", "solver")
    reward_mode = "general"
    reward_range = (-1.0, 1.0)
    fixed_policies: ClassVar = {
        "random": random_setter,
        "oracle": oracle_solver,
        "student": student_solver,
    }

    def __init__(
        self,
        attempts: int = 4,
        band: tuple[float, float] | list[float] = DEFAULT_BAND,
        max_operations: int = DEFAULT_MAX_OPERATIONS,
        max_value: int = DEFAULT_MAX_VALUE,
        nudge: float = 0.0,
        *,
        policies: dict[str, Any] | None = None,
    ) -> None:
        low, high = band
        if attempts < 1 or not 0.0 <= low <= high <= 1.0 or not 0.0 <= nudge < 1.0:
            raise ValueError(
                f"setter-solver: attempts must be >= 1, 0 <= band[0] <= band[1] <= 1 and "
                f"0 <= nudge < 1 (below the band's 1), got attempts={attempts}, band={band}, "
                f"nudge={nudge}"
            )
        super().__init__(policies=policies, max_turns=attempts + 1)
        self.attempts, self.band = attempts, (float(low), float(high))
        self.max_operations, self.max_value, self.nudge = max_operations, max_value, nudge

    def role_reward_range(self, role: str) -> tuple[float, float]:
        """A solver scores 0 or 1; the setter -1 (invalid) to 1."""
        return (0.0, 1.0) if role == "solver" else self.reward_range

    def tasks(self) -> list[dict[str, Any]]:
        """What the setter is asked for (:func:`setter_tasks`)."""
        return _TASKS

    def setup(self, match: Match) -> None:
        """The setter gets its brief and moves first."""
        match.tell("setter", system(SETTER_PROMPT.format(**match.task)), user("Write the problem."))
        match.to_move = "setter"

    def play(self, match: Match, actor: str, turn: AssistantTurn) -> None:
        """The setter's problem is checked and handed to the solvers; each solver is graded;
        after the last one the setter is paid for the solve rate."""
        text = turn.message.content or ""
        if actor == "setter":
            return self._pose(match, text)
        solved = final_number(text) == match.data["value"]
        match.pay(actor, 1.0 if solved else 0.0, "correct")
        match.results[actor] = "solved" if solved else "failed"
        match.data["solved"] += solved
        seat = int(actor.partition("#")[2]) + 1
        if seat < self.attempts:
            match.to_move = f"solver#{seat}"
            return None
        rate = match.data["solved"] / self.attempts
        size = problem_size(
            match.data["problem"], match.data["value"], self.max_operations, self.max_value
        )
        match.pay("setter", nudged_reward(rate, size, self.band, self.nudge), "edge")
        match.metrics.update(
            {"solve_rate": rate, "in_band": setter_reward(rate, self.band), "problem_size": size}
        )
        match.end({"setter": _band_result(rate, self.band)})
        return None

    def _pose(self, match: Match, text: str) -> None:
        try:
            problem, value = read_problem(text, self.max_operations, self.max_value)
        except ValueError as e:
            match.pay("setter", INVALID_PENALTY, "invalid")
            match.metrics["invalid"] = 1.0
            match.data["why_invalid"] = str(e)
            match.end({"setter": "invalid"})
            return
        match.data.update(problem=problem, value=value, solved=0)
        match.metrics["invalid"] = 0.0
        for seat in range(self.attempts):
            match.tell(f"solver#{seat}", system(SOLVER_PROMPT), user(problem))
        match.to_move = "solver#0"
        # No solver sees another's answer: the runner may sample all of them at once.
        match.upcoming = [f"solver#{seat}" for seat in range(1, self.attempts)]


def _band_result(rate: float, band: tuple[float, float]) -> str:
    if rate < band[0]:
        return "too_hard"
    return "too_easy" if rate > band[1] else "edge"


_TASKS = setter_tasks()
