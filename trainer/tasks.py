"""Which tasks each step trains on, from one or several weighted envs.

Each step draws ``tasks_per_step`` task slots. A slot picks an env with probability proportional
to its weight; within an env, tasks come in epochs, each a fresh seeded permutation of the env's
dataset. The whole schedule is a function of the run seed and the per-env cursors, which the
checkpoint stores, so a resumed run trains on exactly the tasks it would have seen.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import envhub
from envhub.env import Env
from envhub.errors import ConfigError
from envhub.trainer.config import EnvSpec


@dataclass
class EnvSlot:
    """One configured env: how to make it, how many tasks it has, how far we are in it."""

    spec: EnvSpec
    size: int
    pass_threshold: float
    cursor: int = 0
    """Tasks of this env handed out so far (across epochs)."""
    num_tools: int = 0
    """Tools the env offers the model (the run header says where the model finds them)."""

    def factory(self) -> Callable[[], Env]:
        """A function that makes a fresh instance of this env (``envhub.make`` with its args)."""
        return lambda: envhub.make(self.spec.name, **self.spec.args)


@dataclass
class TaskSchedule:
    """Hands out ``(env index, task index)`` pairs, deterministically from the seed and cursors."""

    slots: list[EnvSlot]
    seed: int
    _permutations: dict[tuple[int, int], np.ndarray] = field(default_factory=dict, repr=False)

    @classmethod
    def from_specs(cls, specs: list[EnvSpec], seed: int) -> TaskSchedule:
        """Make each env once (checking that it loads) to learn its size and pass threshold."""
        slots = []
        for spec in specs:
            env = envhub.make(spec.name, **spec.args)
            try:
                size = len(env.dataset) if hasattr(env, "dataset") else 0
                if size == 0:
                    raise ConfigError(f"env {spec.name!r} has no dataset of tasks to train on")
                threshold = float(getattr(env, "pass_threshold", 1.0))
                tools = len(env.tool_schemas or ())
                slots.append(EnvSlot(spec, size, threshold, num_tools=tools))
            finally:
                env.close()
        return cls(slots, seed)

    @property
    def pass_threshold(self) -> float:
        """The lowest of the envs' pass thresholds (a step's pass@1 counts against it)."""
        return min(slot.pass_threshold for slot in self.slots)

    def draw(self, step: int, count: int, extra: int = 0) -> list[list[int]]:
        """Task indices per env for ``step`` (``count`` in all); advances the cursors.

        ``extra`` > 0 draws the step's ``extra``-th batch of additional tasks (to replace
        groups without signal), from a stream of its own.
        """
        weights = np.array([s.spec.weight for s in self.slots], dtype=np.float64)
        rng = np.random.default_rng([self.seed, step, 1, extra] if extra else [self.seed, step, 1])
        choices = rng.choice(len(self.slots), size=count, p=weights / weights.sum())
        per_env: list[list[int]] = [[] for _ in self.slots]
        for env_index in choices.tolist():
            per_env[env_index].append(self._next_task(env_index))
        return per_env

    def _next_task(self, env_index: int) -> int:
        slot = self.slots[env_index]
        epoch, position = divmod(slot.cursor, slot.size)
        slot.cursor += 1
        return int(self._permutation(env_index, epoch)[position])

    def _permutation(self, env_index: int, epoch: int) -> np.ndarray:
        key = (env_index, epoch)
        if key not in self._permutations:
            self._permutations.clear()  # only the current epoch is ever needed
            rng = np.random.default_rng([self.seed, env_index, epoch, 2])
            self._permutations[key] = rng.permutation(self.slots[env_index].size)
        return self._permutations[key]

    def state_dict(self) -> dict[str, Any]:
        """The cursor of each env, for a checkpoint (the permutations follow from the seed)."""
        return {"cursors": [s.cursor for s in self.slots]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the cursors that :meth:`state_dict` saved.

        Raises:
            ConfigError: The checkpoint was made with a different number of envs.
        """
        cursors = state["cursors"]
        if len(cursors) != len(self.slots):
            raise ConfigError(
                f"the checkpoint was made with {len(cursors)} envs, "
                f"the config has {len(self.slots)}"
            )
        for slot, cursor in zip(self.slots, cursors, strict=True):
            slot.cursor = int(cursor)
