"""The curriculum moves the levelled built-in envs (wordle, frozenlake, calculator,
calculator-agent, repo-repair) as it moves ``arithmetic``: the schedule learns each level's
size, promotes and demotes the env from the pass rates it is told, and makes the env at its
level; in the producer, real episodes of a scripted policy that wins the easy levels and loses
the hard ones move the level up, then down again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from envhub.envs.calculator import reference_policy as calculator_reference
from envhub.envs.guessing import minimax_policy
from envhub.envs.gym_text import read_lake, shortest_path_policy
from envhub.inference.base import GenerateRequest, Generation
from envhub.testing import ByteChatTokenizer, ScriptedEngine
from envhub.trainer.config import CurriculumConfig, EnvSpec, validate_config
from envhub.trainer.engines.base import RolloutEngine
from envhub.trainer.tasks import TaskSchedule
from envhub.types import Message

from .test_curriculum import produce_steps

Policy = Callable[[list[Message], Any], str]

# Per env: its args, the levels, the level the args select, each level's task count.
LEVELLED = {
    "wordle": (
        {},
        ("list-4", "list-16", "6-guesses", "5-guesses", "4-guesses"),
        "6-guesses",
        [619] * 5,
    ),
    "frozenlake": ({"num_tasks": 5}, ("3x3", "4x4", "6x6", "8x8"), "4x4", [5] * 4),
    "calculator": ({"num_tasks": 5}, ("short", "medium", "long"), "medium", [5] * 3),
    "calculator-agent": ({"num_tasks": 5}, ("short", "medium", "long"), "medium", [5] * 3),
    "repo-repair": ({"level": "one-bug"}, ("one-bug", "helper-bug", "two-bugs"), "one-bug",
                    [20] * 3),
}  # fmt: skip


def _schedule(name: str, args: dict[str, Any]) -> TaskSchedule:
    config = CurriculumConfig.model_validate(
        {"levels": {"window": 2, "promote_above": 0.75, "demote_below": 0.25}}
    )
    return TaskSchedule.from_specs([EnvSpec(name=name, args=args)], 3, config)


def _report(schedule: TaskSchedule, rate: float) -> None:
    """Two groups of 4 at the env's current level, each with this pass rate."""
    tasks = schedule.draw(0, 2)[0]
    solved = round(4 * rate)
    for task in tasks:
        schedule.observe_group(0, schedule.level(0), task, [1.0] * solved + [0.0] * (4 - solved))


@pytest.mark.parametrize("name", list(LEVELLED))
def test_the_schedule_moves_a_levelled_env_up_and_down_from_pass_rates(name: str) -> None:
    args, levels, start, sizes = LEVELLED[name]
    schedule = _schedule(name, args)
    slot = schedule.slots[0]
    assert slot.level_sizes == dict(zip(levels, sizes, strict=True))
    assert schedule.level(0) == start
    first = levels.index(start)
    _report(schedule, 1.0)  # mastered: one up
    assert schedule.level(0) == levels[first + 1]
    _report(schedule, 0.5)  # between the bars: stay
    assert schedule.level(0) == levels[first + 1]
    _report(schedule, 0.0)  # hopeless: one down
    _report(schedule, 0.0)  # and one more
    assert schedule.level(0) == levels[max(first - 1, 0)]
    assert schedule.curriculum.levels[0].moves == (3 if first else 2)
    env = slot.factory(levels[-1])()
    try:
        assert env.current_level() == levels[-1]
        assert env.dataset[0]["info"]["level"] == levels[-1]
    finally:
        env.close()


# -- in the producer ---------------------------------------------------------------------------


def _question(messages: list[Message]) -> str:
    return next(m.content or "" for m in messages if m.role == "user")


def wordle_policy(messages: list[Message], tools: Any) -> str:
    """Wins when the question lists the candidates; guesses no word otherwise."""
    listed = "It is one of these" in _question(messages)
    return minimax_policy(messages, tools) if listed else "<guess>zzzzz</guess>"


def lake_policy(messages: list[Message], tools: Any) -> str:
    """Walks the shortest path on maps up to 4x4; on larger ones walks into the top edge."""
    lake = read_lake(messages)
    small = lake is not None and len(lake) <= 4
    return shortest_path_policy(messages, tools) if small else "<action>up</action>"


def calculator_policy(messages: list[Message], tools: Any) -> str:
    """Computes problems of up to 5 operations with the tool; answers 0 to longer ones."""
    operators = sum(_question(messages).count(op) for op in "+-*")
    return calculator_reference(messages, tools) if operators <= 5 else "\\boxed{0}"


class PolicyEngine(RolloutEngine):
    """Plays a scripted policy, token by token."""

    def __init__(self, policy: Policy) -> None:
        self.inner = ScriptedEngine(policy, ByteChatTokenizer())
        self.tokenizer = self.inner.tokenizer

    async def generate(self, request: GenerateRequest) -> Generation:
        return await self.inner.generate(request)


def _levels_over_steps(
    name: str, args: dict[str, Any], policy: Policy, steps: int
) -> list[tuple[float, set[float]]]:
    """Each step's ``curriculum/level/<name>`` (after the step's groups) and its episodes'
    rewards, in a producer run of 2 tasks a step, 2 samples each, with a level window of 2
    groups."""
    config = validate_config({
        "seed": 3, "steps": steps,
        "envs": [{"name": name, "args": args}],
        "rollout": {"tasks_per_step": 2, "samples_per_task": 2, "max_tokens": 256},
        "curriculum": {"levels": {"window": 2}},
    })  # fmt: skip
    schedule = TaskSchedule.from_specs(config.envs, config.seed, config.curriculum)
    return [
        (s.metrics[f"curriculum/level/{name}"], {t.reward for t in s.trajectories})
        for s in produce_steps(config, schedule, PolicyEngine(policy))
    ]


WON, LOST = {1.0}, {0.0}


@pytest.mark.parametrize(
    ("name", "args", "policy", "steps"),
    [
        # list-4 and list-16 won: up to 6-guesses; lost there: back to list-16; won: up again.
        ("wordle", {"level": "list-4"}, wordle_policy,
         [(1.0, WON), (2.0, WON), (1.0, LOST), (2.0, WON)]),
        # 3x3 and 4x4 won, 6x6 lost.
        ("frozenlake", {"level": "3x3", "num_tasks": 4}, lake_policy,
         [(1.0, WON), (2.0, WON), (1.0, LOST), (2.0, WON)]),
        # short and medium (up to 5 operations) won, long lost.
        ("calculator", {"level": "short", "num_tasks": 4}, calculator_policy,
         [(1.0, WON), (2.0, WON), (1.0, LOST)]),
    ],
)  # fmt: skip
def test_real_episodes_move_the_level_up_while_won_and_down_once_lost(
    name: str, args: dict[str, Any], policy: Policy, steps: list[tuple[float, set[float]]]
) -> None:
    assert _levels_over_steps(name, args, policy, len(steps)) == steps
