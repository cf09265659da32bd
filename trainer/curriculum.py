"""The online curriculum: per-task pass rates that decide which tasks are drawn, and per-env
difficulty levels that move with the measured pass rate (``curriculum:`` of the run config).

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
has nothing to say. An env's level keeps a
window per role at its current level: it moves up when every role's window is full and at or
above ``promote_above`` (the level is easy for all of them), down when any role's full window is
at or below ``demote_below`` (it is too hard for one). A one-role env has one window, so the rule
is the plain one, and its statistics and checkpoint are as before roles. With ``levels.signal:
ties`` a window holds what each group taught instead of its pass rate (1 tied at success, 0.5
taught, 0 tied at failure: :meth:`Curriculum._level_signal`).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from envhub.errors import ConfigError
from envhub.trainer.config import CurriculumConfig

TaskKey = tuple[int, str | None, int]
"""``(env index, level or None, task index)``: a task as the statistics know it."""
Role = str | None
"""A role of a multi-role env (``x``, ``solver``: seats together); ``None`` for a one-role env."""


def pass_rate(rewards: Sequence[float], threshold: float) -> float:
    """The share of ``rewards`` that reach ``threshold`` (a group's pass rate)."""
    return sum(r >= threshold - 1e-9 for r in rewards) / len(rewards) if rewards else 0.0


@dataclass
class EnvLevels:
    """One env's difficulty levels and where the curriculum has it now."""

    names: tuple[str, ...]
    """Easiest first."""
    index: int
    """The current level's position in ``names``."""
    recent: deque[float] = field(default_factory=deque)
    """Pass rates of the last groups played at the current level (emptied by a move)."""
    moves: int = 0
    role_recent: dict[str, deque[float]] = field(default_factory=dict)
    """The same per role, for an env with several roles (``recent`` then stays empty)."""

    def windows(self) -> list[deque[float]]:
        """The windows a move is decided on: one per role, or the one of a one-role env."""
        return list(self.role_recent.values()) or [self.recent]

    def window(self, role: Role) -> deque[float]:
        """The window ``role``'s pass rates go to (made on its first group)."""
        if role is None:
            return self.recent
        if role not in self.role_recent:
            self.role_recent[role] = deque(maxlen=self.recent.maxlen)
        return self.role_recent[role]

    @property
    def current(self) -> str:
        """The current level's name."""
        return self.names[self.index]


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
    """Per-task pass rates, the skip-or-revisit rule and each env's level.

    Args:
        config: The run's ``curriculum:`` block.
        levels: Per env, its levels (easiest first) and the level it starts at; ``None`` for an
            env without levels, or when ``config.levels`` is off.
    """

    def __init__(
        self, config: CurriculumConfig, levels: list[tuple[tuple[str, ...], str] | None]
    ) -> None:
        self.config = config
        self.levels = [_env_levels(entry, config) for entry in levels]
        self.stats: dict[TaskKey, deque[float]] = {}
        """One-role envs' tasks: the pass rates of their recent groups."""
        self.role_stats: dict[TaskKey, dict[str, deque[float]]] = {}
        """Multi-role envs' tasks: the same per role (see the module doc)."""
        self.env_recent: dict[tuple[int, str | None], deque[float]] = {}
        """Per env and level: whether each of its last ``env_window`` groups (any task) taught
        something (1.0) or tied (0.0)."""
        self.counts = DrawCounts()

    def level(self, env_index: int) -> str | None:
        """The level env ``env_index`` is drawn at now (``None``: it has none)."""
        entry = self.levels[env_index]
        return entry.current if entry is not None else None

    def mean_rate(self, key: TaskKey, role: Role = None) -> float | None:
        """The task's (``role``'s) mean pass rate over its recent groups; ``None`` below
        ``min_groups``."""
        rates = self.stats.get(key) if role is None else self.role_stats.get(key, {}).get(role)
        if rates is None or len(rates) < self.config.min_groups:
            return None
        return float(sum(rates) / len(rates))

    def settled(self, key: TaskKey) -> bool:
        """Whether the task is mastered or hopeless, so that it is skipped unless revisited;
        with several roles, whether every role with statistics for it is."""
        return all(rate is not None and self._settled_rate(rate) for rate in self._rates(key))

    def _rates(self, key: TaskKey) -> list[float | None]:
        """The task's mean pass rate per role (one, ``None``-keyed, for a one-role env)."""
        return [self.mean_rate(key, role) for role in self.role_stats.get(key) or [None]]

    def _settled_rate(self, rate: float) -> bool:
        return rate >= self.config.skip_above or rate <= self.config.skip_below

    def _known_rate(self, key: TaskKey) -> float | None:
        """The task's mean pass rate (with several roles, the mean of its roles' that are
        known); ``None`` when none is."""
        known = [rate for rate in self._rates(key) if rate is not None]
        return float(sum(known) / len(known)) if known else None

    def env_factor(self, env_index: int) -> float:
        """What env ``env_index``'s weight is multiplied by: ``revisit + (1 - revisit) x`` the
        share of its recent groups (at its current level) that taught something (rewards that
        differ: GRPO's advantages are not all zero), once it has ``window`` of them; 1 before,
        and always with ``env_window: 0`` or ``env_rule: thompson`` (which chooses apart:
        :meth:`choose_envs`)."""
        recent = self._env_window(env_index)
        if self.config.env_rule != "share" or len(recent) < self.config.window:
            return 1.0
        taught = sum(recent) / len(recent)
        return self.config.revisit + (1.0 - self.config.revisit) * taught

    def _env_window(self, env_index: int) -> Sequence[float]:
        """Whether each of the env's recent groups at its current level taught (1) or tied
        (0); empty without ``env_window``."""
        if not self.config.env_window:
            return ()
        return self.env_recent.get((env_index, self.level(env_index)), ())

    def choose_envs(self, weights: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
        """``count`` task slots' envs by Thompson sampling (``env_rule: thompson``): each slot,
        with probability ``revisit``, an env drawn by ``weights``; otherwise the env whose
        ``weight x`` a draw from ``Beta(1 + taught, 1 + tied)`` (its recent groups) is highest,
        so each env is chosen with the probability that it teaches most. All numbers come from
        ``rng``, slot by slot."""
        p = weights / weights.sum()
        windows = [self._env_window(env_index) for env_index in range(len(weights))]
        taught = [float(sum(window)) for window in windows]  # the same for every slot
        tied = [len(window) - t for window, t in zip(windows, taught, strict=True)]
        choices = np.empty(count, dtype=np.int64)
        for slot in range(count):
            if rng.random() < self.config.revisit:
                choices[slot] = rng.choice(len(p), p=p)
                continue
            sampled = [
                weight * rng.beta(1.0 + taught[e], 1.0 + tied[e]) if weight > 0 else -1.0
                for e, weight in enumerate(weights)
            ]
            choices[slot] = int(np.argmax(sampled))
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
        rate = self._known_rate(key)
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
        window = self.config.window
        if role is None:
            rates = self.stats.setdefault(key, deque(maxlen=window))
        else:
            rates = self.role_stats.setdefault(key, {}).setdefault(role, deque(maxlen=window))
        rates.append(rate)
        env_index, level, _ = key
        if self.config.env_window:
            recent = self.env_recent.setdefault(
                (env_index, level), deque(maxlen=self.config.env_window)
            )
            recent.append(float(not self._settled_rate(rate) if taught is None else taught))
        entry = self.levels[env_index]
        if entry is None or level != entry.current:
            return
        entry.window(role).append(self._level_signal(rate, taught))
        self._maybe_move(entry)

    def _level_signal(self, rate: float, taught: bool | None) -> float:
        """What a group adds to its env's level window: its pass rate, or with ``signal:
        ties`` 0.5 when it taught (rewards that differ) and its pass rate (1 or 0: every sample
        passed or none did) when it tied. ``taught`` unknown: judged from the pass rate."""
        bars = self.config.levels
        assert bars is not None  # an env has levels only when they are configured
        if bars.signal == "pass_rate":
            return rate
        if taught is None:
            taught = 0.0 < rate < 1.0
        return 0.5 if taught else float(rate >= 0.5)

    def _maybe_move(self, entry: EnvLevels) -> None:
        """Up when every window is full and at or above the bar, down when any full one is at
        or below the other (one window: the plain rule); a move empties the windows."""
        bars = self.config.levels
        assert bars is not None  # an env has levels only when they are configured
        windows = entry.windows()
        means = [sum(w) / len(w) for w in windows if len(w) >= bars.window]
        if not means:
            return
        full = len(means) == len(windows)
        if full and min(means) >= bars.promote_above and entry.index + 1 < len(entry.names):
            entry.index += 1
        elif min(means) <= bars.demote_below and entry.index > 0:
            entry.index -= 1
        else:
            return
        entry.moves += 1
        for w in windows:
            w.clear()

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
            "curriculum/tracked_tasks": float(len(self.stats) + len(self.role_stats)),
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
        windows only where there are any, so a one-role run's state is as before roles."""
        state: dict[str, Any] = {
            "stats": [
                [e, lv, t, list(r)] for (e, lv, t), r in sorted(self.stats.items(), key=_order)
            ],
            "levels": [None if e is None else _level_state(e) for e in self.levels],
        }
        if self.env_recent:
            state["env_recent"] = [
                [e, lv, list(r)]
                for (e, lv), r in sorted(
                    self.env_recent.items(), key=lambda i: (i[0][0], i[0][1] or "")
                )
            ]
        if self.role_stats:
            state["role_stats"] = [
                [e, lv, t, role, list(r)]
                for (e, lv, t), roles in sorted(self.role_stats.items(), key=_order)
                for role, r in roles.items()
            ]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on from :meth:`state_dict`.

        Raises:
            ConfigError: The checkpoint's levels do not fit the configured envs.
        """
        saved = state["levels"]
        if len(saved) != len(self.levels) or any(
            (s is None) != (e is None) for s, e in zip(saved, self.levels, strict=True)
        ):
            raise ConfigError(
                "the checkpoint's curriculum levels do not match the config's envs and "
                "curriculum.levels: resume with the config the run was started with"
            )
        window = self.config.window
        self.stats = {
            (int(e), lv, int(t)): deque(rates, maxlen=window) for e, lv, t, rates in state["stats"]
        }
        self.env_recent = {
            (int(e), lv): deque(rates, maxlen=self.config.env_window or None)
            for e, lv, rates in state.get("env_recent", [])  # none before env weights
        }
        self.role_stats = {}
        for e, lv, t, role, rates in state.get("role_stats", []):  # none before roles
            roles = self.role_stats.setdefault((int(e), lv, int(t)), {})
            roles[str(role)] = deque(rates, maxlen=window)
        for entry, s in zip(self.levels, saved, strict=True):
            if entry is not None:
                entry.index, entry.moves = int(s["index"]), int(s["moves"])
                entry.recent = deque(s["recent"], maxlen=entry.recent.maxlen)
                entry.role_recent = {
                    str(role): deque(rates, maxlen=entry.recent.maxlen)
                    for role, rates in s.get("role_recent", {}).items()
                }


def _env_levels(
    entry: tuple[tuple[str, ...], str] | None, config: CurriculumConfig
) -> EnvLevels | None:
    """An env's :class:`EnvLevels` at its start level, when it has levels and they are on."""
    if entry is None or config.levels is None:
        return None
    names, start = entry
    return EnvLevels(names, names.index(start), deque(maxlen=config.levels.window))


def _level_state(entry: EnvLevels) -> dict[str, Any]:
    """One env's level, moves and windows, for the checkpoint."""
    state: dict[str, Any] = {
        "index": entry.index,
        "recent": list(entry.recent),
        "moves": entry.moves,
    }
    if entry.role_recent:
        state["role_recent"] = {role: list(w) for role, w in entry.role_recent.items()}
    return state


def _order(item: tuple[TaskKey, Any]) -> tuple[int, str, int]:
    (env_index, level, task), _ = item
    return (env_index, level or "", task)
