"""The online curriculum: which tasks it skips on a toy table of pass rates, how often it
revisits them with a fixed seed, how levels move on a hand-made sequence of pass rates, and
that a schedule resumed from its state draws what an uninterrupted one does.

The toy env is ``arithmetic`` with 6 tasks and seed 7, whose first two epoch orders are
``[2, 1, 0, 3, 4, 5]`` and ``[1, 0, 3, 2, 5, 4]`` (as a schedule without a curriculum draws
them). The curriculum's stream of step ``s`` is ``default_rng([7, s, 1, 3])``: its first
numbers are ``0.785 0.624 0.442 0.349 ...`` at step 0 and ``0.517 0.970 0.226 0.393 ...`` at
step 1; a settled task is drawn when its number is below ``revisit``.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from typing import Any

import numpy as np
import pytest

from envhub.envs.arithmetic import problem_set, reference_policy
from envhub.errors import ConfigError
from envhub.inference.base import GenerateRequest, Generation
from envhub.testing import ByteChatTokenizer, ScriptedEngine
from envhub.trainer.config import CurriculumConfig, EnvSpec, LevelsConfig, validate_config
from envhub.trainer.curriculum import Curriculum, pass_rate
from envhub.trainer.engines.base import RolloutEngine
from envhub.trainer.groups import Taken
from envhub.trainer.producer import GroupProducer
from envhub.trainer.tasks import TaskSchedule

SIX = [EnvSpec(name="arithmetic", args={"num_tasks": 6})]


def _schedule(specs: list[EnvSpec] = SIX, seed: int = 7, **curriculum: object) -> TaskSchedule:
    return TaskSchedule.from_specs(specs, seed, CurriculumConfig.model_validate(curriculum))


def _rates(schedule: TaskSchedule, table: dict[int, list[float]], env: int = 0) -> None:
    """Give tasks of env ``env`` these group pass rates (one group of 4 samples per rate)."""
    for task, rates in table.items():
        for rate in rates:
            rewards = [1.0] * round(rate * 4) + [0.0] * (4 - round(rate * 4))
            schedule.observe_group(env, schedule.level(env), task, rewards)


def test_the_toy_epochs_and_streams_are_as_the_docstring_says() -> None:
    off = TaskSchedule.from_specs(SIX, 7)
    assert off.draw(0, 6) == [[2, 1, 0, 3, 4, 5]] and off.draw(1, 6) == [[1, 0, 3, 2, 5, 4]]
    assert np.random.default_rng([7, 0, 1, 3]).random(4).round(3).tolist() == [
        0.785, 0.624, 0.442, 0.349,
    ]  # fmt: skip
    assert np.random.default_rng([7, 1, 1, 3]).random(4).round(3).tolist() == [
        0.517, 0.970, 0.226, 0.393,
    ]  # fmt: skip


def test_mastered_and_hopeless_tasks_are_skipped_informative_and_unknown_ones_drawn() -> None:
    schedule = _schedule(revisit=0.0, window=2)
    # 0 mastered (1.0), 3 hopeless (0.0), 1 at (1.0 + 0.5) / 2 = 0.75, 4 at 0.5, 2 and 5 unknown
    _rates(schedule, {0: [1.0], 3: [0.0], 1: [1.0, 0.5], 4: [0.5]})
    # Epoch order 2, 1, 0, 3, 4, 5: 0 and 3 are passed over.
    assert schedule.draw(0, 4) == [[2, 1, 4, 5]]
    metrics = schedule.curriculum_metrics()
    assert metrics == {
        "curriculum/drawn": 4.0,
        "curriculum/skipped": 2.0,
        "curriculum/revisits": 0.0,
        "curriculum/forced": 0.0,
        "curriculum/skipped_share": 2 / 6,
        "curriculum/tracked_tasks": 4.0,
        "curriculum/drawn_pass_rate": (0.75 + 0.5) / 2,  # tasks 1 and 4; 2 and 5 unknown
    }
    # The window keeps the last 2 groups: task 0 falls to (1.0 + 0.5) / 2 and is drawn again.
    _rates(schedule, {0: [0.5]})
    assert schedule.curriculum.mean_rate((0, None, 0)) == 0.75
    assert schedule.draw(1, 3) == [[1, 0, 2]]  # next epoch: 1, 0, (3 skipped), 2


def test_min_groups_and_the_bars_decide_what_is_settled() -> None:
    schedule = _schedule(revisit=0.0, window=3, min_groups=2, skip_above=0.75, skip_below=0.25)
    _rates(schedule, {2: [1.0], 1: [1.0, 0.5], 0: [0.25, 0.25], 3: [0.5, 0.5]})
    # 2 has one group (< min_groups): drawn; 1 at 0.75 >= skip_above: skipped; 0 at 0.25 <=
    # skip_below: skipped; 3 at 0.5: drawn.
    assert schedule.draw(0, 2) == [[2, 3]]
    assert schedule.curriculum_metrics()["curriculum/skipped"] == 2.0


def test_settled_tasks_are_revisited_with_the_revisit_probability_of_the_seeded_stream() -> None:
    schedule = _schedule(revisit=0.5)
    _rates(schedule, {task: [1.0] for task in range(6)})  # everything mastered
    # Step 0: 2 (0.785) skipped, 1 (0.624) skipped, 0 (0.442) and 3 (0.349) revisited.
    assert schedule.draw(0, 2) == [[0, 3]]
    m = schedule.curriculum_metrics()
    assert (m["curriculum/skipped"], m["curriculum/revisits"]) == (2.0, 2.0)
    # Step 1: 4 (0.517) and 5 (0.970) skipped; the next epoch's 1 (0.226), 0 (0.393) revisited.
    assert schedule.draw(1, 2) == [[1, 0]]


def test_revisit_frequency_over_200_steps_with_a_fixed_seed() -> None:
    schedule = _schedule(revisit=0.25)
    _rates(schedule, {task: [1.0] for task in range(6)})
    drawn = [schedule.draw(step, 1)[0][0] for step in range(200)]
    m = schedule.curriculum_metrics()
    # Every task that came up was settled: 159 of 676 (23.5%, for a rate of 25%) revisited;
    # 41 times six in a row were passed over and the seventh drawn anyway.
    assert (m["curriculum/revisits"], m["curriculum/skipped"], m["curriculum/forced"]) == (
        159.0,
        517.0,
        41.0,
    )
    assert m["curriculum/drawn"] == 200.0 and drawn[:10] == [1, 2, 1, 0, 0, 1, 4, 5, 0, 1]
    assert sorted(set(drawn)) == [0, 1, 2, 3, 4, 5]  # nothing is lost for good


def test_an_epoch_of_skips_in_a_row_draws_the_next_task_anyway() -> None:
    schedule = _schedule(revisit=0.0)
    _rates(schedule, {task: [0.0] for task in range(6)})  # everything hopeless
    assert schedule.draw(0, 1) == [[1]]  # 2 1 0 3 4 5 passed over, then the next epoch's 1
    m = schedule.curriculum_metrics()
    assert (m["curriculum/skipped"], m["curriculum/forced"]) == (6.0, 1.0)


TWO_ENVS = [
    EnvSpec(name="arithmetic", args={"num_tasks": 6}),
    EnvSpec(name="arithmetic", args={"num_tasks": 5, "difficulty": "hard"}, weight=3.0),
]


def test_without_env_weights_env_choice_keeps_the_weights_and_the_curriculum_acts_within() -> None:
    specs = TWO_ENVS
    off = TaskSchedule.from_specs(specs, 3)
    on = _schedule(specs, seed=3, revisit=0.0, env_window=0)
    _rates(on, {task: [1.0] for task in range(6)}, env=0)  # env 0 all mastered, env 1 unknown
    env0 = 0
    for step in range(20):
        expected, got = off.draw(step, 4), on.draw(step, 4)
        assert [len(t) for t in got] == [len(t) for t in expected]  # the same env choices
        assert got[1] == expected[1]  # env 1 untouched
        env0 += len(got[0])
    # Every env-0 task was settled: each one drawn only after six in a row were passed over.
    m = on.curriculum_metrics()
    assert env0 > 0 and (m["curriculum/forced"], m["curriculum/skipped"]) == (env0, 6 * env0)


def test_an_env_whose_groups_all_tie_is_drawn_less_by_its_informative_share() -> None:
    on = _schedule(TWO_ENVS, seed=3, revisit=0.1, window=2, env_window=4)
    assert [on.curriculum.env_factor(i) for i in (0, 1)] == [1.0, 1.0]  # nothing known yet
    _rates(on, {0: [1.0]}, env=0)
    assert on.curriculum.env_factor(0) == 1.0  # one group: fewer than window (2)
    _rates(on, {1: [1.0], 2: [0.0]}, env=0)  # mastered, hopeless: nothing taught
    _rates(on, {0: [0.5], 1: [0.75], 2: [0.0], 3: [0.0]}, env=1)  # 2 of 4 taught
    assert on.curriculum.env_factor(0) == 0.1  # revisit + 0.9 x 0/3
    assert on.curriculum.env_factor(1) == 0.1 + 0.9 * 2 / 4
    probabilities = np.array([1.0 * 0.1, 3.0 * 0.55]) / (0.1 + 3.0 * 0.55)
    for step in range(5):
        choices = np.random.default_rng([3, step, 1]).choice(2, size=8, p=probabilities)
        assert [len(tasks) for tasks in on.draw(step, 8)] == [
            int((choices == 0).sum()),
            int((choices == 1).sum()),
        ]
    _rates(on, {3: [0.5], 4: [0.25], 5: [0.5], 0: [0.75]}, env=0)  # the window: 4 taught
    assert on.curriculum.env_factor(0) == 1.0
    metrics = on.curriculum_metrics()
    assert (
        metrics["curriculum/env_weight/arithmetic#0"],
        metrics["curriculum/env_weight/arithmetic#1"],
    ) == (1.0, 0.55)


def test_an_env_weight_counts_groups_whose_rewards_differ_not_pass_rates() -> None:
    on = _schedule(TWO_ENVS, seed=3, revisit=0.0, window=2, env_window=4)
    on.observe_group(0, None, 0, [0.1, 0.0, 0.1, 0.1])  # none passes, but the format differs
    on.observe_group(0, None, 1, [0.1, 0.1, 0.1, 0.1])  # tied at 0.1
    assert on.curriculum.mean_rate((0, None, 0)) == 0.0 and on.curriculum.settled((0, None, 0))
    assert on.curriculum.env_factor(0) == 1 / 2  # task 0 hopeless, yet its group taught
    assert on.curriculum.state_dict()["env_recent"] == [[0, None, [1.0, 0.0]]]


def test_env_weights_never_leave_no_env_to_draw() -> None:
    on = _schedule(TWO_ENVS, seed=3, revisit=0.0, window=1, env_window=2)
    _rates(on, {0: [1.0]}, env=0)
    _rates(on, {0: [0.0]}, env=1)
    assert [on.curriculum.env_factor(i) for i in (0, 1)] == [0.0, 0.0]
    off = TaskSchedule.from_specs(TWO_ENVS, 3)
    assert [len(t) for t in on.draw(0, 8)] == [len(t) for t in off.draw(0, 8)]  # as configured


def _thompson_by_hand(
    seed: int,
    step: int,
    weights: list[float],
    counts: list[tuple[int, int]],
    revisit: float,
    slots: int,
) -> list[int]:
    """Each slot's env, from the stream ``default_rng([seed, step, 1, 4])`` read in the order
    the rule documents: one number for the revisit; below ``revisit``, an env by ``weights``;
    else one Beta(1 + taught, 1 + tied) draw per env, the highest ``weight x draw`` wins."""
    rng, p = np.random.default_rng([seed, step, 1, 4]), np.array(weights) / sum(weights)
    out = []
    for _ in range(slots):
        if rng.random() < revisit:
            out.append(int(rng.choice(len(p), p=p)))
            continue
        draws = [w * rng.beta(1 + t, 1 + n - t) for w, (t, n) in zip(weights, counts, strict=True)]
        out.append(int(np.argmax(draws)))
    return out


def test_thompson_env_choice_by_hand_and_it_favours_the_env_that_teaches() -> None:
    on = _schedule(TWO_ENVS, seed=3, revisit=0.1, window=2, env_window=4, env_rule="thompson")
    _rates(on, {0: [0.5], 1: [0.75], 2: [0.25]}, env=0)  # env 0: 3 of 3 taught
    _rates(on, {0: [0.0], 1: [1.0], 2: [0.0], 3: [0.0]}, env=1)  # env 1: 0 of 4 taught
    assert [on.curriculum.env_factor(i) for i in (0, 1)] == [1.0, 1.0]  # weights as configured
    chosen = []
    for step in range(10):
        expected = _thompson_by_hand(3, step, [1.0, 3.0], [(3, 3), (0, 4)], 0.1, 8)
        got = on.draw(step, 8)
        assert [len(tasks) for tasks in got] == [expected.count(0), expected.count(1)]
        chosen += expected
    # Env 1 has 3x the weight but its 4 groups all tied: it wins a slot only when 3 x
    # Beta(1, 5) beats Beta(4, 1) (22% of the time), or by a revisit (10%, then 3 in 4
    # by weight); by weights alone it would have had 60 of the 80.
    assert chosen.count(0) == 49 and chosen.count(1) == 31
    metrics = on.curriculum_metrics()
    assert metrics["curriculum/env_weight/arithmetic#0"] == 49 / 80
    assert metrics["curriculum/env_weight/arithmetic#1"] == 31 / 80


def test_thompson_with_nothing_known_and_every_slot_a_revisit_is_the_weights() -> None:
    on = _schedule(TWO_ENVS, seed=5, revisit=1.0, env_window=4, env_rule="thompson")
    assert [len(t) for t in on.draw(0, 8)] == [
        _thompson_by_hand(5, 0, [1.0, 3.0], [(0, 0), (0, 0)], 1.0, 8).count(i) for i in (0, 1)
    ]
    with pytest.raises(ConfigError, match="env_rule: thompson .* set curriculum.env_window"):
        validate_config(_config({"env_rule": "thompson"}))


def test_pass_rate_counts_rewards_at_the_threshold() -> None:
    assert pass_rate([1.0, 1.1, 0.1, 0.999999999999], 1.0) == 0.75
    assert pass_rate([], 1.0) == 0.0


# -- levels -----------------------------------------------------------------------------------


def _levels(window: int = 2) -> Curriculum:
    config = CurriculumConfig(
        levels=LevelsConfig(window=window, promote_above=0.75, demote_below=0.25)
    )
    return Curriculum(config, [(("a", "b", "c"), "a"), None])


def test_levels_move_on_a_hand_made_sequence_of_pass_rates_with_hysteresis() -> None:
    curriculum = _levels(window=2)
    seen = []
    for rate in [1.0, 0.5, 1.0, 1.0, 0.5, 0.5, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0]:
        curriculum.observe((0, curriculum.level(0), 0), rate)
        seen.append(curriculum.level(0))
    assert seen == [
        "a",  # [1.0]: not full
        "b",  # [1.0, 0.5] = 0.75 >= 0.75: promote, window emptied
        "b",  # [1.0]: not full
        "c",  # [1.0, 1.0] = 1.0: promote
        "c",  # [0.5]
        "c",  # [0.5, 0.5] = 0.5: between the bars, stay
        "b",  # [0.5, 0.0] = 0.25 <= 0.25: demote
        "b",  # [1.0]
        "c",  # [1.0, 1.0]: promote
        "c",  # [1.0]
        "c",  # [1.0, 1.0]: already the hardest, stay (the window slides on)
        "c",  # [1.0, 1.0]
        "c",  # [1.0, 0.0] = 0.5
        "b",  # [0.0, 0.0]: demote
    ]
    assert curriculum.levels[0].moves == 5 and curriculum.levels[1] is None
    assert curriculum.metrics(["x", "y"])["curriculum/level/x"] == 1.0
    assert "curriculum/level/y" not in curriculum.metrics(["x", "y"])


def test_with_the_ties_signal_levels_move_only_when_most_groups_tie_the_same_way() -> None:
    config = CurriculumConfig(
        levels=LevelsConfig(window=4, promote_above=0.8, demote_below=0.2, signal="ties")
    )
    curriculum = Curriculum(config, [(("a", "b", "c"), "b")])
    seen, windows = [], []
    # (pass rate, taught): a taught group adds 0.5 whatever its pass rate; a tied one its rate.
    groups = [
        (0.25, True), (0.25, True), (0.0, False), (0.25, True),  # 1.5 / 4 = 0.375: stay
        (0.0, False),  # [0.5, 0, 0.5, 0] = 0.25: stay (a pass-rate window would be 0.125: down)
        (0.0, False),  # [0, 0.5, 0, 0] = 0.125 <= 0.2: demote, window emptied
        (1.0, False), (1.0, False), (0.75, True), (1.0, False),  # 3.5 / 4 = 0.875: promote
        (1.0, False), (0.875, True), (1.0, False), (0.875, True),  # 3 / 4 = 0.75: stay
        (1.0, False),  # [0.5, 1, 0.5, 1] = 0.75: stay (a pass-rate window would be 0.94: up)
    ]  # fmt: skip
    for rate, taught in groups:
        curriculum.observe((0, curriculum.level(0), 0), rate, taught=taught)
        seen.append(curriculum.level(0))
        windows.append(list(curriculum.levels[0].recent))
    assert seen == ["b"] * 5 + ["a"] * 4 + ["b"] * 6
    assert windows[4] == [0.5, 0.0, 0.5, 0.0] and windows[5] == [] and windows[9] == []
    assert windows[-1] == [0.5, 1.0, 0.5, 1.0] and curriculum.levels[0].moves == 2


def test_the_ties_signal_judges_a_group_from_its_pass_rate_when_not_told() -> None:
    config = CurriculumConfig(levels=LevelsConfig(window=3, signal="ties"))
    curriculum = Curriculum(config, [(("a", "b"), "a")])
    for rate in (1.0, 0.5, 0.0):
        curriculum.observe((0, "a", 0), rate)
    assert list(curriculum.levels[0].recent) == [1.0, 0.5, 0.0]


def test_the_easiest_level_is_not_left_downwards_and_groups_of_another_level_do_not_count() -> None:
    curriculum = _levels(window=1)
    curriculum.observe((0, "a", 0), 0.0)
    assert curriculum.level(0) == "a"
    curriculum.observe((0, "c", 0), 1.0)  # a stale group of another level: task stats only
    assert curriculum.level(0) == "a" and curriculum.mean_rate((0, "c", 0)) == 1.0


def test_a_schedule_draws_a_levelled_env_at_its_current_level() -> None:
    specs = [EnvSpec(name="arithmetic", args={"num_tasks": 4, "difficulty": "tiny"})]
    levels = {"window": 2, "promote_above": 0.8, "demote_below": 0.2}
    schedule = _schedule(specs, seed=1, levels=levels)
    slot = schedule.slots[0]
    assert slot.level_sizes == {"tiny": 4, "easy": 4, "medium": 4, "hard": 4}
    assert schedule.level(0) == "tiny"
    first = schedule.draw(0, 2)[0]
    _rates(schedule, {first[0]: [1.0], first[1]: [1.0]})  # both solved at tiny
    assert schedule.level(0) == "easy"
    easy = schedule.draw(1, 4)[0]
    assert sorted(easy) == [0, 1, 2, 3]  # a whole epoch of easy's own order
    assert slot.level_cursors == {"tiny": 2, "easy": 4}
    env = slot.factory("easy")()
    assert env.current_level() == "easy" and env.dataset[0]["info"]["difficulty"] == "easy"
    assert schedule.curriculum_metrics()["curriculum/level/arithmetic"] == 1.0


def test_a_levelled_env_starts_at_the_level_its_args_select_and_bad_ones_are_named() -> None:
    specs = [EnvSpec(name="guess-number", args={"num_tasks": 3})]  # 1..100 is level 1-100
    schedule = _schedule(specs, levels={})
    assert schedule.level(0) == "1-100"
    assert schedule.slots[0].factory("1-10")().max_turns == 4
    custom = [EnvSpec(name="guess-number", args={"num_tasks": 3, "low": 5, "high": 9})]
    assert _schedule(custom).level(0) is None  # levels off: the env as configured
    with pytest.raises(ConfigError, match=r"envs.0 \(guess-number\): its args select none of"):
        _schedule(custom, levels={})
    explicit = [EnvSpec(name="guess-number", args={"low": 1, "high": 100})]
    with pytest.raises(ConfigError, match="cannot be made at its level '1-10'.*args.level"):
        _schedule(explicit, levels={})


# -- resume -----------------------------------------------------------------------------------


def _play(schedule: TaskSchedule, steps: range) -> list[tuple[list[list[int]], dict]]:
    """Draw 3 tasks a step and report made-up groups: a task's pass rate is (task % 3) / 2
    at the easiest level, a quarter less per level up."""
    out = []
    for step in range(steps.start, steps.stop):
        drawn = schedule.draw(step, 3)
        for env_index, tasks in enumerate(drawn):
            level = schedule.level(env_index)
            depth = schedule.slots[env_index].level_sizes and list(
                schedule.slots[env_index].level_sizes
            ).index(level)
            for task in tasks:
                rate = max(0.0, (task % 3) / 2 - 0.25 * (depth or 0))
                n = round(rate * 4)
                schedule.observe_group(env_index, level, task, [1.0] * n + [0.0] * (4 - n))
        out.append((drawn, schedule.curriculum_metrics()))
    return out


@pytest.mark.parametrize(
    "extra", [{}, {"env_window": 4, "env_rule": "thompson"}], ids=["weights", "thompson"]
)
def test_a_schedule_resumed_from_its_state_draws_what_an_uninterrupted_one_draws(
    extra: dict[str, Any],
) -> None:
    specs = [
        EnvSpec(name="arithmetic", args={"num_tasks": 7, "difficulty": "tiny"}),
        EnvSpec(name="guess-number", args={"num_tasks": 5}, weight=2.0),
    ]
    config = {"revisit": 0.3, "window": 2, "levels": {"window": 3}, **extra}
    straight = _play(_schedule(specs, seed=11, **config), range(12))
    first = _schedule(specs, seed=11, **config)
    assert _play(first, range(6)) == straight[:6]
    state = json.loads(json.dumps(first.state_dict()))  # as the checkpoint stores it
    resumed = _schedule(specs, seed=11, **config)
    resumed.load_state_dict(state)
    assert _play(resumed, range(6, 12)) == straight[6:]
    moved = [m for _, m in straight if m["curriculum/level/arithmetic"] > 0]
    assert moved and sum(m["curriculum/skipped"] for _, m in straight) > 0  # it did something


def test_a_checkpoint_without_curriculum_state_is_refused_by_a_run_with_one() -> None:
    state = TaskSchedule.from_specs(SIX, 7).state_dict()
    with pytest.raises(ConfigError, match="without a curriculum"):
        _schedule().load_state_dict(state)


# -- config -----------------------------------------------------------------------------------


def _config(curriculum: object) -> dict:
    return {"envs": [{"name": "arithmetic"}], "curriculum": curriculum}


def test_the_curriculum_is_off_by_default_and_its_block_is_validated() -> None:
    assert validate_config({"envs": [{"name": "arithmetic"}]}).curriculum is None
    on = validate_config(_config({"revisit": 0.2, "levels": {}}))
    assert on.curriculum.revisit == 0.2 and on.curriculum.levels.window == 16
    with pytest.raises(ConfigError, match="skip_below .* must be below skip_above"):
        validate_config(_config({"skip_below": 0.5, "skip_above": 0.5}))
    with pytest.raises(ConfigError, match="demote_below .* must be below promote_above"):
        validate_config(_config({"levels": {"demote_below": 0.9, "promote_above": 0.8}}))
    with pytest.raises(ConfigError, match="min_groups .* cannot exceed curriculum.window"):
        validate_config(_config({"window": 2, "min_groups": 3}))
    with pytest.raises(ConfigError, match=r"curriculum.revisit"):
        validate_config(_config({"revisit": 1.5}))
    with pytest.raises(ConfigError, match="did you mean 'revisit'"):
        validate_config(_config({"revisits": 0.1}))
    assert on.curriculum.levels.signal == "pass_rate"
    with pytest.raises(ConfigError, match=r"curriculum.levels.signal.*'pass_rate' or 'ties'"):
        validate_config(_config({"levels": {"signal": "tie"}}))


def test_deques_keep_only_the_window() -> None:
    schedule = _schedule(window=2)
    _rates(schedule, {0: [0.0, 1.0, 1.0]})
    assert schedule.curriculum.tasks.windows[(0, None, 0)] == {None: deque([1.0, 1.0])}


# -- in the producer ---------------------------------------------------------------------------


def produce_steps(config: Any, schedule: TaskSchedule, engine: Any) -> list[Taken]:
    """``config.steps`` steps taken from a real producer, the engine's weights version moved on
    after each as an update would."""

    async def steps() -> list[Taken]:
        producer = GroupProducer(config, schedule, engine)
        producer.start(first_draw=0)
        taken = []
        try:
            for step in range(config.steps):
                taken.append(await producer.take(step))
                engine.weights_version = step + 1
                producer.advance()
        finally:
            await producer.aclose()
        return taken

    return asyncio.run(steps())


class SolvingEngine(RolloutEngine):
    """Answers every arithmetic problem right (the env's reference policy), token by token."""

    def __init__(self) -> None:
        self.inner = ScriptedEngine(reference_policy, ByteChatTokenizer())
        self.tokenizer = self.inner.tokenizer

    async def generate(self, request: GenerateRequest) -> Generation:
        return await self.inner.generate(request)


def test_the_producer_plays_each_draw_at_the_level_its_env_has_then() -> None:
    """Every group is solved, so with a level window of 2 groups the env moves up a level
    after each step of 2 tasks: the jobs carry the level and the envs are made at it."""
    config = validate_config({
        "seed": 3, "steps": 4,
        "envs": [{"name": "arithmetic", "args": {"difficulty": "tiny", "num_tasks": 5}}],
        "rollout": {"tasks_per_step": 2, "samples_per_task": 2, "max_tokens": 16},
        "curriculum": {"levels": {"window": 2}},
    })  # fmt: skip
    schedule = TaskSchedule.from_specs(config.envs, config.seed, config.curriculum)
    taken = produce_steps(config, schedule, SolvingEngine())
    for step, level in zip(taken, ["tiny", "easy", "medium", "hard"], strict=True):
        problems = problem_set(level, 5, seed=0)
        for t in step.trajectories:  # each prompt is the problem of its task at that level
            question = next(m.content for m in t.messages if m.role == "user")
            assert question == problems[t.task_index]["question"]
    assert all(t.reward == 1.1 for s in taken for t in s.trajectories)
    levels = [s.metrics["curriculum/level/arithmetic"] for s in taken]
    assert levels == [1.0, 2.0, 3.0, 3.0]  # after each step's groups; hard is the last


def test_held_out_evaluation_keeps_its_fixed_tasks_and_level() -> None:
    from envhub.trainer.held_out import HeldOutEval

    def targets(curriculum: object) -> list[tuple]:
        config = validate_config({
            "envs": [{"name": "arithmetic", "args": {"difficulty": "tiny"}}],
            "eval": {"envs": [{"name": "arithmetic", "args": {"difficulty": "easy"},
                               "num_tasks": 4}]},
            "curriculum": curriculum,
        })  # fmt: skip
        return [(t.label, t.spec.args, t.tasks) for t in HeldOutEval(config).targets]

    assert targets({"levels": {"window": 1}}) == targets(None)
    assert targets(None) == [("arithmetic", {"difficulty": "easy"}, [0, 333, 666, 999])]
