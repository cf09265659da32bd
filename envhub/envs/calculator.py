"""A multi-turn tool env: arithmetic too long to do in one's head, with a ``calculate`` tool.

Tasks are generated from the seed (no download): nested expressions of 3-5 operations on
numbers up to four digits (``level="medium"``; ``"short"`` and ``"long"`` are the easier and
harder levels a training curriculum can move to, see :data:`LEVELS`). The model calls
``calculate`` as often as it likes, then answers with ``\\boxed{...}``. Reward: 1 for the right
number; tool validity is reported as a weight-0 component. The answer must be a number
(:func:`~envhub.rewards.match.number_answer`): math-verify evaluates expressions, so echoing the
question ("Compute: 73 * (5349 + 6467)") scored 1.0 without a single tool call (the reward
audit, :mod:`envhub.audit`, found it).

``demonstration=True`` puts one worked exchange before the question (a question, the call, the
tool's answer, the boxed result): a small model that never writes a call on its own imitates it
(SmolLM2-135M: no attempt in 32 episodes without it, 14 with it).
``tool_call_reward=w`` adds a dense reward for learning the tool's format: the first turn of an
episode whose calls all run pays ``w`` at once (``State.pay``, component ``tool_use``), so
per-turn credit can reward a well-formed call before the model can finish a task. Any
well-formed call earns it, so ``w`` becomes the env's ``audit_floor``.
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass
from typing import Any

from envhub.envs.expressions import evaluate, format_number, make_problem
from envhub.envs.procedural import ProceduralTasks
from envhub.errors import EnvhubError
from envhub.multiturn import TOOL_FORMAT_HINT, ToolEnv
from envhub.rewards.format import tool_call_validity
from envhub.rewards.match import number_answer
from envhub.rewards.rubric import Rubric
from envhub.state import State
from envhub.tools.prompt import tool_call_block
from envhub.tools.tool import tool
from envhub.types import AssistantTurn, Message, assistant, user


@tool(inline=True)
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: Numbers combined with + - * / and parentheses, e.g. "(1234 + 56) * 7".
    """
    return format_number(evaluate(expression))


@dataclass(frozen=True)
class Level:
    """How the problems of one difficulty are drawn."""

    operations: tuple[int, int]
    """Fewest and most operators per problem."""
    max_operand: int


LEVELS = {
    "short": Level(operations=(1, 2), max_operand=999),
    "medium": Level(operations=(3, 5), max_operand=9999),
    "long": Level(operations=(6, 8), max_operand=9999),
}
"""The calculator's difficulty levels (``level=``), easiest first: how many operations a
problem has and how large its numbers are (a factor of ``*`` is always 2..99)."""
DEFAULT_LEVEL = "medium"


def make_task(rng: random.Random, level: str = DEFAULT_LEVEL) -> dict[str, Any]:
    """One calculator task of ``level`` (default: 3-5 operations on numbers up to four digits)."""
    drawn = LEVELS[level]
    expression = make_problem(rng, rng.randint(*drawn.operations), drawn.max_operand)
    return {
        "question": f"Compute: {expression}",
        "answer": format_number(evaluate(expression)),
        "info": {"expression": expression, "level": level},
    }


class ProblemSet(ProceduralTasks):
    """``size`` calculator problems of ``level``, each a pure function of (level, seed, index).

    Raises:
        EnvhubError: An unknown level.
    """

    def __init__(self, size: int = 1000, seed: int = 0, level: str = DEFAULT_LEVEL) -> None:
        if level not in LEVELS:
            raise EnvhubError(
                f"calculator: level must be one of {', '.join(LEVELS)}, got {level!r}"
            )
        # The default level keeps the generator's first name, so its problems stay as they were.
        name = "calculator" if level == DEFAULT_LEVEL else f"calculator-{level}"
        super().__init__(name, functools.partial(make_task, level=level), size, seed)
        self.level = level


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
        tool_call_reward: Paid once per episode, for the first turn whose tool calls all run
            (see the module docstring; 0: only the answer pays).
        demonstration: Show one worked exchange before the question (in the prompt, never
            trained on).
        level: One of :data:`LEVELS`: ``"short"`` (1-2 operations, numbers up to 999),
            ``"medium"`` (3-5 operations, up to 9999; the default) or ``"long"`` (6-8
            operations): the levels a training curriculum moves between.
        **kwargs: See :class:`~envhub.multiturn.ToolEnv`.
    """

    name = "calculator"
    version = "0.1.0"
    system_prompt = SYSTEM_PROMPT
    default_max_turns = 6
    reward_range = (0.0, 1.0)
    tools = (calculate,)
    levels = tuple(LEVELS)

    def __init__(
        self,
        num_tasks: int = 1000,
        task_seed: int = 0,
        tool_call_reward: float = 0.0,
        demonstration: bool = False,
        level: str = DEFAULT_LEVEL,
        **kwargs: Any,
    ) -> None:
        if tool_call_reward < 0:
            raise ValueError(f"calculator: tool_call_reward must be >= 0, got {tool_call_reward}")
        self.num_tasks, self.task_seed, self.level = num_tasks, task_seed, level
        self.tool_call_reward = float(tool_call_reward)
        self.demonstration = demonstration
        if self.tool_call_reward:
            self.reward_range = (0.0, 1.0 + self.tool_call_reward)
            self.pass_threshold = 1.0
            self.audit_floor = self.tool_call_reward  # any well-formed call earns it
        super().__init__(**kwargs)

    def load_dataset(self) -> ProblemSet:
        """``num_tasks`` calculator problems of ``level``, generated from ``task_seed``."""
        return ProblemSet(self.num_tasks, self.task_seed, self.level)

    def format_prompt(self, task: dict[str, Any]) -> list[Message]:
        """The system prompt and the question, with the worked exchange between them when
        ``demonstration`` is on."""
        *head, question = super().format_prompt(task)
        return [*head, *DEMONSTRATION, question] if self.demonstration else [*head, question]

    async def setup_state(self, state: State) -> None:
        """With ``tool_call_reward``: report the ``tool_use`` component in every episode."""
        await super().setup_state(state)
        if self.tool_call_reward:
            state.paid["tool_use"] = 0.0

    async def env_response(self, state: State, turn: AssistantTurn) -> list[Message]:
        """Run the turn's calls; pay ``tool_call_reward`` for the episode's first turn whose
        calls all ran."""
        calls, errors = state.metrics["tool_calls"], state.metrics["tool_errors"]
        reply = await super().env_response(state, turn)
        made = state.metrics["tool_calls"] - calls
        failed = state.metrics["tool_errors"] - errors
        if self.tool_call_reward and made and not failed:
            state.pay_once(self.tool_call_reward, "tool_use")
        return reply

    def default_rubric(self) -> Rubric:
        """1.0 for the right number; tool-call validity is logged with weight 0."""
        return Rubric([number_answer(), tool_call_validity()])


DEMONSTRATION = (
    user("Compute: (12 + 30) * 5"),
    assistant(tool_call_block("calculate", {"expression": "(12 + 30) * 5"})),
    Message(role="tool", content="210", tool_call_id="call_0", name="calculate"),
    assistant("The result is \\boxed{210}."),
)
"""The worked exchange ``demonstration`` shows: one call, its result, the boxed answer."""

_EXPRESSION = re.compile(r"Compute: (.+)$")


def reference_policy(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
    """Solves every task: one ``calculate`` call, then the boxed result."""
    last = messages[-1]
    if last.role == "tool":
        return f"The result is \\boxed{{{last.content}}}."
    question = next(m.content or "" for m in reversed(messages) if m.role == "user")
    match = _EXPRESSION.search(question)
    expression = match.group(1) if match else question
    return tool_call_block("calculate", {"expression": expression})


CalculatorEnv.reference_policy = staticmethod(reference_policy)
