"""``curriculum.rule: teach``: each task drawn with the estimated chance that its next group
teaches (its rewards differ), computed by hand on toy groups; envs weighted by their share; the
chances and the draws survive a checkpoint; a task with several roles teaches when any role does.

The toy env and streams are test_curriculum's: ``arithmetic`` with 6 tasks and seed 7, whose first
epoch order is ``[2, 1, 0, 3, 4, 5]``; the curriculum's stream of step 0 starts
``0.785 0.624 0.442 0.349 0.495 ...`` (one number per task whose chance is below 1).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from envhub.trainer.config import CurriculumConfig, EnvSpec
from envhub.trainer.curriculum import Curriculum
from envhub.trainer.tasks import TaskSchedule

SIX = [EnvSpec(name="arithmetic", args={"num_tasks": 6})]
TWO_ENVS = [
    EnvSpec(name="arithmetic", args={"num_tasks": 6}),
    EnvSpec(name="arithmetic", args={"num_tasks": 6}, weight=3.0),
]


def _teach(specs: list[EnvSpec] = SIX, seed: int = 7, **curriculum: object) -> TaskSchedule:
    config = CurriculumConfig.model_validate({"rule": "teach", **curriculum})
    return TaskSchedule.from_specs(specs, seed, config)


def _groups(schedule: TaskSchedule) -> None:
    """Task 0: two groups tied at 1; task 1: one that passed once in four; task 2: one nobody
    passed whose format reward differed. The env: 2 of 4 groups taught, prior (2+1)/(4+1)."""
    schedule.observe_group(0, None, 0, [1.0, 1.0, 1.0, 1.0])
    schedule.observe_group(0, None, 0, [1.1, 1.1, 1.1, 1.1])
    schedule.observe_group(0, None, 1, [1.0, 0.0, 0.0, 0.0])
    schedule.observe_group(0, None, 2, [0.1, 0.0, 0.0, 0.1])


def test_chances_by_hand_partial_credit_teaches_and_an_unseen_task_gets_its_env_share() -> None:
    schedule = _teach(revisit=0.1)
    curriculum = schedule.curriculum
    assert curriculum.teach_chance((0, None, 3)) == 1.0  # nothing known: draw it
    _groups(schedule)
    assert curriculum.env_prior(0, None) == pytest.approx(3 / 5)
    chances = [curriculum.teach_chance((0, None, t)) for t in range(4)]
    assert chances == pytest.approx([0.6 / 3, 1.6 / 2, 1.6 / 2, 0.6])
    assert curriculum.mean_rate((0, None, 2)) == 0.0  # hopeless by pass rate, yet it teaches
    assert curriculum.env_factor(0) == pytest.approx(0.6)


def test_draws_follow_the_chances_on_the_seeded_stream() -> None:
    schedule = _teach(revisit=0.1)
    _groups(schedule)
    # epoch order 2 1 0 3 4 5 against 0.785 0.624 0.442 0.349 0.495: task 2 (0.8) drawn,
    # 1 (0.8) drawn, 0 (0.2) skipped, 3 (0.6) drawn, 4 (0.6) drawn
    assert np.random.default_rng([7, 0, 1, 3]).random(5).round(3).tolist() == [
        0.785, 0.624, 0.442, 0.349, 0.495,
    ]  # fmt: skip
    assert schedule.draw(0, 4) == [[2, 1, 3, 4]]
    metrics = schedule.curriculum_metrics()
    assert (metrics["curriculum/drawn"], metrics["curriculum/skipped"]) == (4, 1)
    assert metrics["curriculum/drawn_teach_chance"] == pytest.approx((0.8 + 0.8 + 0.6 + 0.6) / 4)


def test_revisit_is_the_floor_of_a_task_chance() -> None:
    schedule = _teach(revisit=0.5, window=2)
    for task in range(6):  # every group tied: the env prior is 1/7
        schedule.observe_group(0, None, task, [1.0] * 4)
    chance = (0 + 1 / 7) / 2
    assert schedule.curriculum.teach_chance((0, None, 0)) == pytest.approx(chance)
    assert schedule.curriculum.env_factor(0) == 0.5
    # numbers 0.785 0.624 0.442 0.349: two skipped, then drawn at the floor 0.5
    assert schedule.draw(0, 2) == [[0, 3]]


def test_env_weights_are_scaled_by_each_env_share_that_taught() -> None:
    schedule = _teach(TWO_ENVS, seed=3, revisit=0.1)
    assert schedule._weights().tolist() == [1.0, 3.0]  # nothing known yet
    for task in range(3):
        schedule.observe_group(0, None, task, [1.0] * 4)  # env 0: 0 of 3 taught
        schedule.observe_group(1, None, task, [1.0, 0.0, 1.0, 1.0])  # env 1: 3 of 3
    assert schedule._weights().tolist() == pytest.approx([1.0 * max(0.1, 1 / 4), 3.0 * 1.0])


def test_a_window_drops_its_oldest_group_from_the_task_and_the_env() -> None:
    schedule = _teach(window=2)
    for rewards in ([1.0, 0.0, 0.0, 0.0], [1.0] * 4, [1.0] * 4):
        schedule.observe_group(0, None, 0, rewards)
    curriculum = schedule.curriculum
    assert list(curriculum.taught[((0, None, 0), None)]) == [False, False]
    assert curriculum.env_prior(0, None) == 1 / 3  # (0 + 1) / (2 + 1): the first one dropped


def test_a_resumed_schedule_has_the_same_chances_and_draws_the_same() -> None:
    straight, first = _teach(TWO_ENVS, seed=5, window=3), _teach(TWO_ENVS, seed=5, window=3)

    def play(schedule: TaskSchedule, steps: range) -> list[list[list[int]]]:
        drawn = []
        for step in steps:
            tasks = schedule.draw(step, 6)
            drawn.append(tasks)
            for env, env_tasks in enumerate(tasks):
                for task in env_tasks:  # task t of env e passes (t + e) % 5 of 4 (4: all)
                    passed = (task + env) % 5
                    schedule.observe_group(env, None, task, [1.0] * passed + [0.0] * (4 - passed))
        return drawn

    whole = play(straight, range(10))
    assert play(first, range(5)) == whole[:5]
    state = json.loads(json.dumps(first.state_dict()))
    assert {len(entry) for entry in state["curriculum"]["taught"]} == {5}
    resumed = _teach(TWO_ENVS, seed=5, window=3)
    resumed.load_state_dict(state)
    keys = [(e, None, t) for e in (0, 1) for t in range(6)]
    chances = [first.curriculum.teach_chance(k) for k in keys]
    assert [resumed.curriculum.teach_chance(k) for k in keys] == chances
    assert play(resumed, range(5, 10)) == whole[5:]


def test_a_task_with_roles_teaches_when_any_role_group_does() -> None:
    curriculum = Curriculum(CurriculumConfig(rule="teach", revisit=0.0), [None])
    key = (0, None, 0)
    curriculum.observe(key, 1.0, role="x", taught=False)
    curriculum.observe(key, 0.0, role="x", taught=False)
    curriculum.observe(key, 0.5, role="o", taught=True)
    assert curriculum.env_prior(0, None) == 2 / 4
    assert curriculum.teach_chance(key) == pytest.approx((1 + 0.5) / 2)  # o's, not x's 0.5/3


def test_the_pass_rate_rule_keeps_no_teach_state() -> None:
    schedule = TaskSchedule.from_specs(SIX, 7, CurriculumConfig())
    _groups(schedule)
    assert schedule.curriculum.taught == {}
    assert "taught" not in schedule.state_dict()["curriculum"]
