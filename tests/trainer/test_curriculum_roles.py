"""The curriculum on envs with several roles: pass rates per task *and role* (never pooled), a
task skipped only when every role with statistics is settled, levels moved on every role's
window, the producer reporting each role apart, and exact resume (old one-role states load).

Tic-tac-toe pays a win 1, a draw 0 and a loss -1, with ``pass_threshold`` 1 (a win passes).
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from typing import Any

import numpy as np

from envhub.envs.setter_solver import SetterSolverEnv
from envhub.envs.tictactoe import TicTacToeEnv
from envhub.inference.base import GenerateRequest, Generation
from envhub.rollout.runner import RolloutRunner
from envhub.testing import ByteChatTokenizer, ScriptedEngine
from envhub.trainer.config import CurriculumConfig, EnvSpec, LevelsConfig, validate_config
from envhub.trainer.curriculum import Curriculum
from envhub.trainer.engines.base import RolloutEngine
from envhub.trainer.groups import rewards_by_role
from envhub.trainer.tasks import TaskSchedule

from .test_curriculum import produce_steps
from .test_roles import first_free

GAME = [EnvSpec(name="tic-tac-toe")]


def _schedule(**curriculum: object) -> TaskSchedule:
    return TaskSchedule.from_specs(GAME, 7, CurriculumConfig.model_validate(curriculum))


def _epoch_order() -> list[int]:
    """The game's first epoch order with seed 7 (what a schedule without a curriculum draws)."""
    return TaskSchedule.from_specs(GAME, 7).draw(0, 73)[0]


def test_a_task_is_settled_only_when_every_role_with_statistics_is() -> None:
    schedule = _schedule(revisit=0.0)
    a, b, c, d, e, f = _epoch_order()[:6]
    games = {
        a: {"x": [1.0, 1.0], "o": [-1.0, -1.0]},  # X always wins: both roles settled (pooled: 0.5)
        b: {"x": [1.0, -1.0], "o": [-1.0, 1.0]},  # each side wins one: informative
        c: {"x": [0.0, 0.0], "o": [0.0, 0.0]},  # always a draw: both hopeless
        d: {"x": [1.0, 1.0]},  # only X measured (O's episodes lost): X's word decides
    }
    for task, by_role in games.items():
        for role, rewards in by_role.items():
            schedule.observe_group(0, None, task, rewards, role)
    windows = schedule.curriculum.tasks.windows
    assert all(None not in roles for roles in windows.values())  # nothing pooled
    assert windows[(0, None, a)] == {
        "x": deque([1.0]),
        "o": deque([0.0]),
    }
    assert schedule.draw(0, 3) == [[b, e, f]]
    metrics = schedule.curriculum_metrics()
    assert (metrics["curriculum/skipped"], metrics["curriculum/drawn"]) == (3.0, 3.0)
    assert metrics["curriculum/tracked_tasks"] == 4.0
    assert metrics["curriculum/drawn_pass_rate"] == 0.5  # b: (0.5 + 0.5) / 2; e, f unknown


def test_a_role_below_min_groups_keeps_its_task_drawn() -> None:
    curriculum = Curriculum(CurriculumConfig(min_groups=2, window=2), [None])
    key = (0, None, 5)
    for rate in (1.0, 1.0):
        curriculum.observe(key, rate, "x")
    curriculum.observe(key, 0.0, "o")
    assert curriculum.mean_rate(key, "x") == 1.0 and curriculum.mean_rate(key, "o") is None
    assert not curriculum.settled(key)
    curriculum.observe(key, 0.0, "o")
    assert curriculum.settled(key)


def test_rewards_are_split_by_role_from_real_rollouts() -> None:
    engine = ScriptedEngine(first_free, tokenizer=ByteChatTokenizer())
    runner = RolloutRunner(engine, TicTacToeEnv, max_concurrency=2, seed=11)
    game = asyncio.run(runner.run([0], samples_per_task=2))
    # First free cell for both: X 1, O 2, X 3, O 4, X 5, O 6, X 7 wins on the diagonal 3-5-7.
    assert rewards_by_role(game) == {"x": [1.0, 1.0], "o": [-1.0, -1.0]}

    def classroom(messages: list[Any], tools: Any) -> str:
        if "You write arithmetic problems" in (messages[0].content or ""):
            return "<problem>2 + 2</problem>"
        return "\\boxed{4}"

    engine = ScriptedEngine(classroom, tokenizer=ByteChatTokenizer())
    runner = RolloutRunner(engine, lambda: SetterSolverEnv(attempts=3), max_concurrency=1)
    episode = asyncio.run(runner.run([0]))
    # Solved by all three: too easy, the setter earns 0; each solver earns 1.
    assert rewards_by_role(episode) == {"setter": [0.0], "solver": [1.0, 1.0, 1.0]}


def test_a_role_cut_short_by_another_roles_crash_is_not_measured() -> None:
    def crashing_o(messages: list[Any], rng: Any) -> str:
        raise RuntimeError("the opponent's script broke")

    engine = ScriptedEngine(first_free, tokenizer=ByteChatTokenizer())
    factory = lambda: TicTacToeEnv(policies={"o": crashing_o})  # noqa: E731
    [x] = asyncio.run(RolloutRunner(engine, factory, seed=1).run([0]))
    assert x.outcome == "env_failure" and rewards_by_role([x]) == {}


class FirstFreeEngine(RolloutEngine):
    """Both sides take the first free cell, token by token."""

    def __init__(self) -> None:
        self.inner = ScriptedEngine(first_free, ByteChatTokenizer())
        self.tokenizer = self.inner.tokenizer

    async def generate(self, request: GenerateRequest) -> Generation:
        return await self.inner.generate(request)


def test_the_producer_reports_each_role_of_a_group_apart() -> None:
    config = validate_config({
        "seed": 3, "steps": 1,
        "envs": [{"name": "tic-tac-toe"}],
        "rollout": {"tasks_per_step": 3, "samples_per_task": 2, "max_tokens": 24},
        "curriculum": {"window": 2},
    })  # fmt: skip
    schedule = TaskSchedule.from_specs(config.envs, config.seed, config.curriculum)
    [taken] = produce_steps(config, schedule, FirstFreeEngine())
    expected: dict[tuple, dict[str, deque[float]]] = {}
    for t in taken.trajectories:
        won = [u.reward == 1.0 for u in taken.trajectories if u.group_key == t.group_key]
        rate = sum(won) / len(won)
        expected.setdefault((0, None, t.task_index), {})[t.role] = deque([rate])
    assert len(expected) == 3 and all(set(r) == {"x", "o"} for r in expected.values())
    assert schedule.curriculum.tasks.windows == expected  # per role, nothing pooled
    # A deterministic policy decides every game the same way: each role's rate is 0 or 1.
    assert {rate for roles in expected.values() for r in roles.values() for rate in r} <= {
        0.0,
        1.0,
    }


def _levels(window: int = 2) -> Curriculum:
    config = CurriculumConfig(
        levels=LevelsConfig(window=window, promote_above=0.75, demote_below=0.25)
    )
    return Curriculum(config, [(("a", "b", "c"), "a")])


def test_levels_move_up_when_every_role_is_above_the_bar_down_when_any_is_below() -> None:
    curriculum = _levels(window=2)
    seen = []
    for role, rate in [
        ("x", 1.0),  # x [1.0]
        ("o", 1.0),  # o [1.0]
        ("x", 1.0),  # x [1.0, 1.0] full, o not: a one-role env would move up here; stay
        ("o", 0.5),  # o [1.0, 0.5] = 0.75: both full and at the bar: up to b, windows emptied
        ("x", 1.0),
        ("x", 1.0),  # x full at 1.0, o empty: stay
        ("o", 0.0),  # o [0.0]
        ("o", 0.0),  # o [0.0, 0.0] = 0.0 <= 0.25: too hard for O: down to a
    ]:
        curriculum.observe((0, curriculum.level(0), 3), rate, role)
        seen.append(curriculum.level(0))
    assert seen == ["a", "a", "a", "b", "b", "b", "b", "a"]
    entry = curriculum.levels[0]
    assert entry.moves == 2 and entry.recent == deque()
    assert entry.role_recent == {"x": deque(), "o": deque()}


def test_role_statistics_and_windows_resume_exactly() -> None:
    config = CurriculumConfig(
        window=3, revisit=0.5, levels=LevelsConfig(window=3, promote_above=0.75)
    )
    first = Curriculum(config, [(("a", "b"), "a")])
    for task, role, rate in [(1, "x", 1.0), (1, "o", 0.0), (2, "x", 0.5), (1, "x", 1.0)]:
        first.observe((0, "a", task), rate, role)
    state = json.loads(json.dumps(first.state_dict()))  # as the checkpoint stores it
    assert state["role_stats"] == [
        [0, "a", 1, "x", [1.0, 1.0]],
        [0, "a", 1, "o", [0.0]],
        [0, "a", 2, "x", [0.5]],
    ]
    assert state["levels"][0]["role_recent"] == {"x": [1.0, 0.5, 1.0], "o": [0.0]}
    resumed = Curriculum(config, [(("a", "b"), "a")])
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state
    for curriculum in (first, resumed):  # the same next observations move both the same way
        curriculum.observe((0, "a", 1), 1.0, "o")
        curriculum.observe((0, "a", 1), 1.0, "o")
    assert first.state_dict() == resumed.state_dict() and first.level(0) == "a"
    picks = [
        [c.admit((0, "a", t), np.random.default_rng(5)) for t in (1, 2, 1, 2)]
        for c in (first, resumed)
    ]
    assert picks[0] == picks[1]


def test_a_one_role_state_is_as_before_roles_and_an_old_one_loads() -> None:
    config = CurriculumConfig(levels=LevelsConfig(window=2))
    one_role = Curriculum(config, [(("a", "b"), "a"), None])
    one_role.observe((0, "a", 4), 0.5)
    state = one_role.state_dict()
    assert state == {
        "stats": [[0, "a", 4, [0.5]]],
        "levels": [{"index": 0, "recent": [0.5], "moves": 0}, None],
    }
    old = {
        "stats": [[0, "b", 2, [1.0, 0.0]]],
        "levels": [{"index": 1, "recent": [1.0], "moves": 3}, None],
    }
    loaded = Curriculum(config, [(("a", "b"), "a"), None])
    loaded.load_state_dict(old)
    assert loaded.state_dict() == old
    assert all(list(roles) == [None] for roles in loaded.tasks.windows.values())
    assert loaded.level(0) == "b" and loaded.mean_rate((0, "b", 2)) == 0.5
