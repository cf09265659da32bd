"""ReMax's greedy baselines: a group waits for its task's greedy episode, whichever comes first,
and a greedy episode that failed outside the policy's control gives no baseline."""

from __future__ import annotations

import math

from envhub.trainer.greedy_baselines import GreedyBaselines, baseline_reward
from envhub.types import EnvRef, ErrorRecord, Trajectory, user


def _episode(group: str, reward: float, infra: bool = False) -> Trajectory:
    errors = [ErrorRecord(stage="engine", type="EngineError", message="down", infra=True)]
    return Trajectory(
        env=EnvRef(name="e"),
        task_index=0,
        group_id=group,
        messages=[user("q")],
        prompt_length=1,
        reward=reward,
        errors=errors if infra else [],
    )


def test_each_group_is_handed_on_once_its_baseline_is_in() -> None:
    handed: list[tuple[int, list[float | None]]] = []
    baselines = GreedyBaselines(positions=[4, 7])  # the job's tasks sit at positions 4 and 7
    receive = baselines.hold(lambda p, g: handed.append((p, [t.baseline_reward for t in g])))
    receive(4, [_episode("s1e0g4", 1.0), _episode("s1e0g4", 0.0)])  # before its greedy episode
    assert handed == []
    baselines.baseline(_episode("g0", 0.5))  # the greedy runner's group g0 is position 4
    assert handed == [(4, [0.5, 0.5])]
    baselines.baseline(_episode("g1", 1.0))  # position 7's baseline comes first this time
    receive(7, [_episode("s1e0g7", 1.0)])
    assert handed == [(4, [0.5, 0.5]), (7, [1.0])]
    assert baselines.rewards == {4: 0.5, 7: 1.0}


def test_a_greedy_episode_that_failed_outside_the_policy_gives_no_baseline() -> None:
    assert math.isnan(baseline_reward(_episode("g0", 0.0, infra=True)))
    assert baseline_reward(_episode("g0", 0.25)) == 0.25
