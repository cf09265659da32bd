"""Difficulty levels: each env's current level and the windows that move it.

An env's level keeps a window per role at its current level (one, under the role ``None``, for a
one-role env): it moves up when every role's window is full and at or above ``promote_above``
(the level is easy for all of them), down when any role's full window is at or below
``demote_below`` (it is too hard for one). With ``levels.signal: ties`` a window holds what each
group taught instead of its pass rate (:func:`level_signal`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from envhub.errors import ConfigError
from envhub.trainer.config import CurriculumConfig, LevelsConfig
from envhub.trainer.curriculum.keys import Role


@dataclass
class EnvLevels:
    """One env's difficulty levels and where the curriculum has it now."""

    names: tuple[str, ...]
    """Easiest first."""
    index: int
    """The current level's position in ``names``."""
    size: int
    """How many groups a window holds."""
    windows: dict[Role, deque[float]] = field(default_factory=dict)
    """Per role, what the last groups played at the current level added (emptied by a move)."""
    moves: int = 0

    @property
    def current(self) -> str:
        """The current level's name."""
        return self.names[self.index]

    @property
    def recent(self) -> deque[float]:
        """A one-role env's window (empty for an env with several roles)."""
        return self.windows.get(None, deque(maxlen=self.size))

    @property
    def role_recent(self) -> dict[str, deque[float]]:
        """The windows of an env with several roles, per role."""
        return {role: w for role, w in self.windows.items() if role is not None}

    def window(self, role: Role) -> deque[float]:
        """The window ``role``'s groups go to (made on its first group)."""
        return self.windows.setdefault(role, deque(maxlen=self.size))

    def state(self) -> dict[str, Any]:
        """The level, moves and windows, for the checkpoint (``role_recent`` only where any)."""
        state: dict[str, Any] = {"index": self.index, "recent": list(self.recent),
                                 "moves": self.moves}  # fmt: skip
        if self.role_recent:
            state["role_recent"] = {role: list(w) for role, w in self.role_recent.items()}
        return state

    def load(self, state: dict[str, Any]) -> None:
        """Go on from :meth:`state`."""
        self.index, self.moves = int(state["index"]), int(state["moves"])
        self.windows = {}
        if state["recent"] or not state.get("role_recent"):
            self.windows[None] = deque(state["recent"], maxlen=self.size)
        for role, rates in state.get("role_recent", {}).items():
            self.windows[str(role)] = deque(rates, maxlen=self.size)


def level_signal(bars: LevelsConfig, rate: float, taught: bool | None) -> float:
    """What a group adds to its env's level window: its pass rate, or with ``signal: ties`` 0.5
    when it taught (rewards that differ) and its pass rate (1 or 0: every sample passed or none
    did) when it tied. ``taught`` unknown: judged from the pass rate."""
    if bars.signal == "pass_rate":
        return rate
    if taught is None:
        taught = 0.0 < rate < 1.0
    return 0.5 if taught else float(rate >= 0.5)


def maybe_move(entry: EnvLevels, bars: LevelsConfig) -> None:
    """Up when every window is full and at or above the bar, down when any full one is at or
    below the other (one window: the plain rule); a move empties the windows."""
    windows = list(entry.role_recent.values()) or [entry.window(None)]
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


def env_levels(
    entry: tuple[tuple[str, ...], str] | None, config: CurriculumConfig
) -> EnvLevels | None:
    """An env's :class:`EnvLevels` at its start level, when it has levels and they are on."""
    if entry is None or config.levels is None:
        return None
    names, start = entry
    return EnvLevels(names, names.index(start), config.levels.window)


def load_levels(levels: list[EnvLevels | None], saved: list[dict[str, Any] | None]) -> None:
    """Go on from the checkpoint's levels.

    Raises:
        ConfigError: They do not fit the configured envs.
    """
    if len(saved) != len(levels) or any(
        (s is None) != (e is None) for s, e in zip(saved, levels, strict=True)
    ):
        raise ConfigError(
            "the checkpoint's curriculum levels do not match the config's envs and "
            "curriculum.levels: resume with the config the run was started with"
        )
    for entry, state in zip(levels, saved, strict=True):
        if entry is not None:
            assert state is not None  # checked above
            entry.load(state)
