"""Task skipping: each task's (each role's) recent pass rates, and whether it is settled."""

from __future__ import annotations

from collections import deque
from typing import Any

from envhub.trainer.config import CurriculumConfig
from envhub.trainer.curriculum.keys import Role, TaskKey, key_order


class TaskRates:
    """The pass rates of each task's recent groups, per role for an env with several.

    A one-role env's task has one window, under the role ``None``; a multi-role env's task has
    one per role that played it, so X's and O's results are never pooled.
    """

    def __init__(self, config: CurriculumConfig) -> None:
        self.config = config
        self.windows: dict[TaskKey, dict[Role, deque[float]]] = {}
        """Per task, per role: the pass rates of its last ``window`` groups."""

    def observe(self, key: TaskKey, role: Role, rate: float) -> None:
        """Add a group's pass rate to the task's (role's) window."""
        roles = self.windows.setdefault(key, {})
        roles.setdefault(role, deque(maxlen=self.config.window)).append(rate)

    def mean(self, key: TaskKey, role: Role = None) -> float | None:
        """The task's (``role``'s) mean pass rate; ``None`` below ``min_groups``."""
        rates = self.windows.get(key, {}).get(role)
        if rates is None or len(rates) < self.config.min_groups:
            return None
        return float(sum(rates) / len(rates))

    def settled(self, key: TaskKey) -> bool:
        """Whether the task is mastered or hopeless (with several roles: every role with
        statistics for it is), so that it is skipped unless revisited."""
        return all(rate is not None and self.settled_rate(rate) for rate in self._means(key))

    def settled_rate(self, rate: float) -> bool:
        """Whether a pass rate is at or beyond ``skip_above`` / ``skip_below``."""
        return rate >= self.config.skip_above or rate <= self.config.skip_below

    def known_rate(self, key: TaskKey) -> float | None:
        """The mean of the task's roles' known mean pass rates; ``None`` when none is known."""
        known = [rate for rate in self._means(key) if rate is not None]
        return float(sum(known) / len(known)) if known else None

    def _means(self, key: TaskKey) -> list[float | None]:
        """The task's mean pass rate per role (one, ``None``-keyed, for a one-role env)."""
        return [self.mean(key, role) for role in self.windows.get(key) or [None]]

    def state(self) -> dict[str, Any]:
        """``stats`` (one-role tasks) and, where any, ``role_stats`` (per role), JSON-ready."""
        ordered = sorted(self.windows.items(), key=lambda item: key_order(item[0]))
        state: dict[str, Any] = {
            "stats": [[*key, list(roles[None])] for key, roles in ordered if None in roles]
        }
        by_role = [
            [*key, role, list(rates)]
            for key, roles in ordered
            for role, rates in roles.items()
            if role is not None
        ]
        if by_role:
            state["role_stats"] = by_role
        return state

    def load(self, state: dict[str, Any]) -> None:
        """Go on from :meth:`state` (a checkpoint without ``role_stats`` has none)."""
        window = self.config.window
        self.windows = {}
        for e, lv, t, rates in state["stats"]:
            self.windows[(int(e), lv, int(t))] = {None: deque(rates, maxlen=window)}
        for e, lv, t, role, rates in state.get("role_stats", []):
            roles = self.windows.setdefault((int(e), lv, int(t)), {})
            roles[str(role)] = deque(rates, maxlen=window)
