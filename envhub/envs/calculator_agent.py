"""The calculator tasks, played by an OpenAI Agents SDK agent: a harness env to train on.

The same problems as :mod:`envhub.envs.calculator`, but the episode is a run of an ordinary
Agents SDK program (``openai-agents``): an ``Agent`` with a ``calculate`` function tool on the
chat-completions model, pointed at the episode's endpoint. The policy's turns are sampled and
recorded by the rollout runner as for any env (see :mod:`envhub.harness`); the agent executes
the calls and decides when it is done. Reward: 1 for the right number in the final answer.

``demonstration=True`` hands the agent one worked exchange (as input items before the question),
as the native env's option does; ``call_reward=w`` pays ``w`` for the first well-formed call.
"""

from __future__ import annotations

import functools
from typing import Any

from envhub.envs.calculator import (
    DEFAULT_LEVEL,
    DEMONSTRATION,
    LEVELS,
    SYSTEM_PROMPT,
    ProblemSet,
    calculate,
    reference_policy,
)
from envhub.harness.env import HarnessEnv
from envhub.rewards.format import tool_call_validity
from envhub.rewards.match import number_answer
from envhub.rewards.rubric import Rubric


def demonstration_items() -> list[dict[str, Any]]:
    """The native env's worked exchange as Agents SDK input items."""
    question, call, result, answer = DEMONSTRATION
    return [
        {"role": "user", "content": question.content},
        {"role": "assistant", "content": call.content},
        {"type": "function_call_output", "call_id": "call_0", "output": result.content},
        {"role": "assistant", "content": answer.content},
    ]


async def calculator_agent(client: Any, prompt: str, *, demonstration: bool = False) -> str:
    """An Agents SDK agent that answers ``prompt`` with a ``calculate`` tool; its final output."""
    import agents

    agents.set_tracing_disabled(True)  # no traces leave the machine
    agent = agents.Agent(
        name="calculator",
        instructions=SYSTEM_PROMPT,
        tools=[agents.function_tool(calculate.fn)],  # the native env's tool, as a function tool
        model=agents.OpenAIChatCompletionsModel(model="policy", openai_client=client),
    )
    question = {"role": "user", "content": prompt}
    items = [*demonstration_items(), question] if demonstration else [question]
    result = await agents.Runner.run(agent, items, max_turns=100)  # the env counts the calls
    return str(result.final_output)


class CalculatorAgentEnv(HarnessEnv):
    """Calculator problems solved by an Agents SDK agent (``pip install openai-agents``).

    Args:
        num_tasks: Size of the generated task set.
        task_seed: Seed of the task generator.
        demonstration: Give the agent one worked exchange before the question.
        level: One of the calculator's :data:`~envhub.envs.calculator.LEVELS` (``"short"``,
            ``"medium"``, the default, or ``"long"``): the levels a curriculum moves between.
        **kwargs: See :class:`~envhub.harness.HarnessEnv` (``max_turns`` counts the agent's
            calls, ``call_reward`` pays for the first well-formed one).
    """

    name = "calculator-agent"
    version = "0.1.0"
    default_max_turns = 4
    reward_range = (0.0, 1.0)
    reference_policy = staticmethod(reference_policy)
    levels = tuple(LEVELS)

    def __init__(
        self,
        num_tasks: int = 1000,
        task_seed: int = 0,
        demonstration: bool = False,
        level: str = DEFAULT_LEVEL,
        **kwargs: Any,
    ) -> None:
        self.num_tasks, self.task_seed, self.demonstration = num_tasks, task_seed, demonstration
        self.level = level
        super().__init__(**kwargs)

    def load_dataset(self) -> ProblemSet:
        """``num_tasks`` calculator problems of ``level``, generated from ``task_seed``."""
        return ProblemSet(self.num_tasks, self.task_seed, self.level)

    def make_program(self) -> Any:
        """The Agents SDK calculator agent (with the demonstration when asked)."""
        program = functools.partial(calculator_agent, demonstration=self.demonstration)
        functools.update_wrapper(program, calculator_agent)
        return program

    def default_rubric(self) -> Rubric:
        """1.0 for the right number in the final answer; call validity logged with weight 0."""
        return Rubric([number_answer(), tool_call_validity()])
