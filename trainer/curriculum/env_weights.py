"""Env weighting: how often each env's recent groups taught something, and the envs' share of
task slots that follows (``env_window`` with ``env_rule: share`` or ``thompson``)."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from envhub.trainer.config import CurriculumConfig


class EnvWeights:
    """Per env and level, whether each of its last ``env_window`` groups (any task) taught
    something (1.0: rewards that differ, so GRPO's advantages are not all zero) or tied (0.0)."""

    def __init__(self, config: CurriculumConfig) -> None:
        self.config = config
        self.recent: dict[tuple[int, str | None], deque[float]] = {}

    def observe(self, env_index: int, level: str | None, taught: bool) -> None:
        """Record whether a group of the env, played at ``level``, taught something."""
        if self.config.env_window:
            window = self.recent.setdefault(
                (env_index, level), deque(maxlen=self.config.env_window)
            )
            window.append(float(taught))

    def window(self, env_index: int, level: str | None) -> Sequence[float]:
        """The env's recent groups at ``level`` (empty without ``env_window``)."""
        if not self.config.env_window:
            return ()
        return self.recent.get((env_index, level), ())

    def factor(self, env_index: int, level: str | None) -> float:
        """What the env's weight is multiplied by: ``revisit + (1 - revisit) x`` the share of its
        recent groups at ``level`` that taught, once it has ``window`` of them; 1 before, and
        always with ``env_window: 0`` or ``env_rule: thompson`` (which chooses apart:
        :meth:`choose`)."""
        recent = self.window(env_index, level)
        if self.config.env_rule != "share" or len(recent) < self.config.window:
            return 1.0
        taught = sum(recent) / len(recent)
        return self.config.revisit + (1.0 - self.config.revisit) * taught

    def choose(
        self,
        weights: np.ndarray,
        windows: Sequence[Sequence[float]],
        count: int,
        rng: np.random.Generator,
    ) -> np.ndarray:
        """``count`` task slots' envs by Thompson sampling: each slot, with probability
        ``revisit``, an env drawn by ``weights``; otherwise the env whose ``weight x`` a draw from
        ``Beta(1 + taught, 1 + tied)`` (its ``windows`` entry) is highest, so each env is chosen
        with the probability that it teaches most. All numbers come from ``rng``, slot by slot."""
        p = weights / weights.sum()
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
        return choices

    def state(self) -> list[list[Any]]:
        """The windows as ``[env index, level, rates]`` rows, JSON-ready (empty: none)."""
        ordered = sorted(self.recent.items(), key=lambda item: (item[0][0], item[0][1] or ""))
        return [[e, lv, list(rates)] for (e, lv), rates in ordered]

    def load(self, rows: list[list[Any]]) -> None:
        """Go on from :meth:`state`."""
        self.recent = {
            (int(e), lv): deque(rates, maxlen=self.config.env_window or None)
            for e, lv, rates in rows
        }
