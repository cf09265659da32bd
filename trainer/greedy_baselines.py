"""ReMax's baselines (``algorithm.advantage: remax``): one greedy episode per task.

Beside a job's sampled episodes, one more runner plays each of its tasks once at temperature 0;
the reward of that greedy episode is the baseline of every sample of the task
(``Trajectory.baseline_reward``). Both run at once on the same engine. A group streamed to the
producer as soon as it is scored (``run_job``'s ``on_group``) is held until its task's greedy
episode is in, so no group reaches the update without its baseline. The greedy episodes are
not trained on; a greedy episode that failed outside the policy's control (an env or engine
error, a timeout) gives no baseline (``nan``), and the estimator gives its samples 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from envhub.errors import ConfigError
from envhub.types import TRAINED_OUTCOMES, Trajectory

GREEDY_SEED_OFFSET = 7919
"""Added to a job's runner seed for its greedy runner (other episode seeds than the samples')."""

OnGroup = Callable[[int, list[Trajectory]], None]


class GreedyBaselines:
    """Pairs each group of a job with the reward of its task's greedy episode.

    Args:
        positions: The job's groups' positions, in the order of its tasks (the greedy runner's
            group ``g{k}`` is the task at ``positions[k]``).
    """

    def __init__(self, positions: Sequence[int]) -> None:
        self.positions = list(positions)
        self.rewards: dict[int, float] = {}
        """Each position's baseline, once its greedy episode is in."""
        self._held: dict[int, tuple[OnGroup, list[Trajectory]]] = {}

    def hold(self, on_group: OnGroup) -> OnGroup:
        """``on_group`` that waits for each group's baseline before handing the group on."""

        def receive(position: int, group: list[Trajectory]) -> None:
            if position in self.rewards:
                on_group(position, self.with_baseline(position, group))
            else:
                self._held[position] = (on_group, group)

        return receive

    def baseline(self, greedy: Trajectory) -> None:
        """The runner's ``on_trajectory`` for the greedy episodes: record, release the group.

        Raises:
            ConfigError: The env has several roles (one greedy episode has no one baseline).
        """
        if greedy.role is not None:
            raise ConfigError(
                "advantage: remax needs one greedy episode per task, but this env has several "
                f"roles ({greedy.role}, ...): use grpo, rloo or another group estimator"
            )
        position = self.positions[int(greedy.group_id.removeprefix("g"))]
        self.rewards[position] = baseline_reward(greedy)
        if position in self._held:
            on_group, group = self._held.pop(position)
            on_group(position, self.with_baseline(position, group))

    def with_baseline(self, position: int, group: list[Trajectory]) -> list[Trajectory]:
        """``group``'s trajectories with their task's baseline recorded."""
        reward = self.rewards[position]
        return [t.model_copy(update={"baseline_reward": reward}) for t in group]


def baseline_reward(greedy: Trajectory) -> float:
    """A greedy episode's reward as a baseline: ``nan`` when it failed outside the policy's
    control (it says nothing about how good the policy's greedy answer is)."""
    return greedy.reward if greedy.outcome in TRAINED_OUTCOMES else math.nan
