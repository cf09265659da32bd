"""The online curriculum: per-task pass rates that decide which tasks are drawn, per-env weights
from how often an env's groups teach, and per-env difficulty levels that move with the measured
pass rate (``curriculum:`` of the run config).

Three policies, each in its own module, behind one :class:`Curriculum`:

- task skipping (:mod:`.task_rates`): a task that is mastered or hopeless is passed over unless a
  revisit draws it;
- env weighting (:mod:`.env_weights`): ``env_window`` with ``env_rule: share`` scales an env's
  weight by the share of its recent groups that taught; ``thompson`` chooses each task slot's env
  by Thompson sampling;
- levels (:mod:`.levels`): an env with levels moves up and down between them.

The task schedule asks :meth:`Curriculum.admit` about each task its env's epoch order brings
up; the producer reports every scored group with :meth:`Curriculum.observe` when an update
takes it. Nothing here draws randomness of its own: the schedule passes in a generator seeded
from the run's seed and the step, so the choices depend only on the seed, the step and the
statistics, which :meth:`Curriculum.state_dict` saves with the checkpoint.

An env with several roles (:mod:`envhub.roles`) is tracked per task *and role*: a tic-tac-toe
task's X and O results, or the setter's and the solvers', are not pooled into one rate. Such a
task is settled only when every role that has statistics for it is (a setter whose problems
are always in its band does not make the task uninformative while its solvers' results still
vary); a role that never played it (the solvers of a setter that never wrote a valid problem)
has nothing to say. A one-role env has one window per task and per level, so its rules are the
plain ones and its checkpoint has no per-role entries.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from envhub.trainer.config import CurriculumConfig
from envhub.trainer.curriculum.env_weights import EnvWeights
from envhub.trainer.curriculum.keys import Role, TaskKey, pass_rate
from envhub.trainer.curriculum.levels import (
    EnvLevels,
    env_levels,
    level_signal,
    load_levels,
    maybe_move,
)
from envhub.trainer.curriculum.task_rates import TaskRates

__all__ = ["Curriculum", "DrawCounts", "EnvLevels", "Role", "TaskKey", "pass_rate"]


@dataclass
class DrawCounts:
    """What the curriculum did since the last :meth:`Curriculum.metrics`."""

    drawn: int = 0
    skipped: int = 0
    revisits: int = 0
    forced: int = 0
    known_rates: list[float] = field(default_factory=list)
    """Mean pass rates of the drawn tasks that had statistics."""
    env_slots: Counter[int] = field(default_factory=Counter)
    """Task slots each env was chosen for (``env_rule: thompson``)."""


class Curriculum:
    """Task skipping, env weighting and each env's level, fed by the same scored groups.

    Args:
        config: The run's ``curriculum:`` block.
        levels: Per env, its levels (easiest first) and the level it starts at; ``None`` for an
            env without levels, or when ``config.levels`` is off.
    """

    def __init__(
        self, config: CurriculumConfig, levels: list[tuple[tuple[str, ...], str] | None]
    ) -> None:
        self.config = config
        self.tasks = TaskRates(config)
        self.envs = EnvWeights(config)
        self.levels = [env_levels(entry, config) for entry in levels]
        self.counts = DrawCounts()

    def level(self, env_index: int) -> str | None:
        """The level env ``env_index`` is drawn at now (``None``: it has none)."""
        entry = self.levels[env_index]
        return entry.current if entry is not None else None

    def mean_rate(self, key: TaskKey, role: Role = None) -> float | None:
        """The task's (``role``'s) mean pass rate over its recent groups; ``None`` below
        ``min_groups``."""
        return self.tasks.mean(key, role)

    def settled(self, key: TaskKey) -> bool:
        """Whether the task is mastered or hopeless (every role with statistics for it is)."""
        return self.tasks.settled(key)

    def env_factor(self, env_index: int) -> float:
        """What env ``env_index``'s weight is multiplied by now (:meth:`EnvWeights.factor` at
        the env's current level)."""
        return self.envs.factor(env_index, self.level(env_index))

    def choose_envs(self, weights: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
        """``count`` task slots' envs by Thompson sampling on each env's recent groups at its
        current level (``env_rule: thompson``: :meth:`EnvWeights.choose`)."""
        windows = [self.envs.window(e, self.level(e)) for e in range(len(weights))]
        choices = self.envs.choose(weights, windows, count, rng)
        self.counts.env_slots.update(choices.tolist())
        return choices

    def admit(self, key: TaskKey, rng: np.random.Generator) -> bool:
        """Whether the task that came up is drawn: always when it is still informative (or
        unknown); when settled, with probability ``revisit`` (one number from ``rng``)."""
        if self.settled(key):
            if rng.random() >= self.config.revisit:
                self.counts.skipped += 1
                return False
            self.counts.revisits += 1
        self._count_drawn(key)
        return True

    def force(self, key: TaskKey) -> None:
        """Count a task drawn because every task of its env's epoch was skipped."""
        self.counts.forced += 1
        self._count_drawn(key)

    def _count_drawn(self, key: TaskKey) -> None:
        self.counts.drawn += 1
        rate = self.tasks.known_rate(key)
        if rate is not None:
            self.counts.known_rates.append(rate)

    def observe(
        self, key: TaskKey, rate: float, role: Role = None, taught: bool | None = None
    ) -> None:
        """A scored group of the task (of one ``role`` of it, for an env with several), with
        its pass rate and whether its rewards differed (``taught``: the group has an advantage
        to learn from; ``None``: judged from the pass rate): the task's statistics, its env's
        recent groups, and its env's level window when the group was played at the env's
        current level (which may move)."""
        self.tasks.observe(key, role, rate)
        env_index, level, _ = key
        self.envs.observe(
            env_index, level, not self.tasks.settled_rate(rate) if taught is None else taught
        )
        entry = self.levels[env_index]
        if entry is None or level != entry.current:
            return
        bars = self.config.levels
        assert bars is not None  # an env has levels only when they are configured
        entry.window(role).append(level_signal(bars, rate, taught))
        maybe_move(entry, bars)

    def metrics(self, labels: list[str]) -> dict[str, float]:
        """``curriculum/*`` since the last call: tasks drawn, skipped, revisited and forced, the
        skipped share of the tasks that came up, the mean pass rate of the drawn tasks that had
        statistics, and each levelled env's current level (its position, 0 the easiest) as
        ``curriculum/level/<label>``; with ``env_window``, ``curriculum/env_weight/<label>``:
        the factor of :meth:`env_factor`, or with ``env_rule: thompson`` the share of the task
        slots chosen since the last call that went to the env."""
        c = self.counts
        came_up = c.drawn + c.skipped
        metrics = {
            "curriculum/drawn": float(c.drawn),
            "curriculum/skipped": float(c.skipped),
            "curriculum/revisits": float(c.revisits),
            "curriculum/forced": float(c.forced),
            "curriculum/skipped_share": c.skipped / came_up if came_up else 0.0,
            "curriculum/tracked_tasks": float(len(self.tasks.windows)),
        }
        if c.known_rates:
            metrics["curriculum/drawn_pass_rate"] = float(np.mean(c.known_rates))
        for index, (label, entry) in enumerate(zip(labels, self.levels, strict=True)):
            if entry is not None:
                metrics[f"curriculum/level/{label}"] = float(entry.index)
            if self.config.env_rule == "thompson":
                slots = sum(c.env_slots.values())
                metrics[f"curriculum/env_weight/{label}"] = (
                    c.env_slots[index] / slots if slots else 0.0
                )
            elif self.config.env_window:
                metrics[f"curriculum/env_weight/{label}"] = self.env_factor(index)
        self.counts = DrawCounts()
        return metrics

    def state_dict(self) -> dict[str, Any]:
        """The statistics, the levels and their windows (JSON-ready); per-role statistics and
        windows, and env windows, only where there are any."""
        tasks = self.tasks.state()
        state = {
            "stats": tasks["stats"],
            "levels": [None if e is None else e.state() for e in self.levels],
        }
        if env_recent := self.envs.state():
            state["env_recent"] = env_recent
        if "role_stats" in tasks:
            state["role_stats"] = tasks["role_stats"]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on from :meth:`state_dict`.

        Raises:
            ConfigError: The checkpoint's levels do not fit the configured envs.
        """
        load_levels(self.levels, state["levels"])
        self.tasks.load(state)
        self.envs.load(state.get("env_recent", []))
