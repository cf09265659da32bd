"""Which tasks each step trains on, from one or several weighted envs.

Each step draws ``tasks_per_step`` task slots. A slot picks an env with probability proportional
to its weight; within an env, tasks come in epochs, each a fresh seeded permutation of the env's
dataset. The whole schedule is a function of the run seed and the per-env cursors, which the
checkpoint stores, so a resumed run trains on exactly the tasks it would have seen.

With a curriculum (``curriculum:``, :mod:`~envhub.trainer.curriculum`) the envs are still chosen
by weight from the same stream (each weight scaled by how much its env teaches, with
``env_window``), or with ``env_rule: thompson`` by Thompson sampling from a stream of its own;
within an env the epoch order is walked as before, but a task
the curriculum deems settled (mastered or hopeless) is passed over unless a revisit draws it,
and an env with levels is drawn at its current level (each level with its own epochs and
cursor). Its choices come from a stream of their own, seeded from the run's seed and the step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import envhub
from envhub.env import Env
from envhub.errors import ConfigError, EnvhubError
from envhub.references import display_name
from envhub.trainer.config import CurriculumConfig, EnvSpec
from envhub.trainer.curriculum import Curriculum, pass_rate


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
    tools_from_program: bool = False
    """A harness env: its tools come with its program's calls (the header says so too)."""
    level_arg: str = ""
    """The constructor argument that selects a level (with curriculum levels)."""
    level_sizes: dict[str, int] = field(default_factory=dict)
    """Tasks per level, for an env the curriculum moves between levels (empty: none)."""
    level_cursors: dict[str, int] = field(default_factory=dict)
    """Tasks handed out so far at each level."""
    roles: tuple[str, ...] = ()
    """The roles the policy plays in a multi-role env (none in a one-role env)."""

    def level_args(self, level: str | None) -> dict[str, Any]:
        """The constructor arguments that select ``level`` (none for ``None``)."""
        return {} if level is None else {self.level_arg: level}

    def factory(self, level: str | None = None) -> Callable[[], Env]:
        """A function that makes a fresh instance of this env (``envhub.make`` with its args),
        at ``level`` when given."""
        args = self.spec.args | self.level_args(level)
        return lambda: envhub.make(self.spec.name, **args)


@dataclass(frozen=True)
class ScheduleState:
    """What a checkpoint keeps of the task schedule."""

    cursors: list[int]
    """Per env, tasks handed out so far."""
    envs: list[str] | None = None
    """The envs' names, in order (``None``: a checkpoint older than the names)."""
    curriculum: dict[str, Any] | None = None
    """The curriculum's statistics and levels (:meth:`Curriculum.state_dict`), with one."""
    level_cursors: list[dict[str, int]] | None = None
    """Per env, tasks handed out so far at each level, with a curriculum."""

    def to_json(self) -> dict[str, Any]:
        """Plain values; the curriculum's entries only with one."""
        data: dict[str, Any] = {"cursors": self.cursors, "envs": self.envs}
        if self.curriculum is not None:
            data |= {"curriculum": self.curriculum, "level_cursors": self.level_cursors}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ScheduleState:
        """Any state a run wrote, older layouts included (no ``envs``)."""
        level_cursors = data.get("level_cursors")
        return cls(
            cursors=[int(c) for c in data["cursors"]],
            envs=data.get("envs"),
            curriculum=data.get("curriculum"),
            level_cursors=None
            if level_cursors is None
            else [{str(k): int(v) for k, v in c.items()} for c in level_cursors],
        )


@dataclass
class TaskSchedule:
    """Hands out ``(env index, task index)`` pairs, deterministically from the seed and cursors."""

    slots: list[EnvSlot]
    seed: int
    curriculum: Curriculum | None = None
    _permutations: dict[tuple[int, str | None, int], np.ndarray] = field(
        default_factory=dict, repr=False
    )

    @classmethod
    def from_specs(
        cls, specs: list[EnvSpec], seed: int, curriculum: CurriculumConfig | None = None
    ) -> TaskSchedule:
        """Make each env once (checking that it loads) to learn its size and pass threshold;
        with curriculum levels, also once per level of an env that has levels."""
        slots, levels = [], []
        for index, spec in enumerate(specs):
            env = envhub.make(spec.name, **spec.args)
            try:
                size = _dataset_size(env, spec.name)
                threshold = float(getattr(env, "pass_threshold", 1.0))
                tools = len(env.tool_schemas or ())
                roles = tuple(getattr(env, "trained_roles", ()))
                program = bool(getattr(env, "tools_come_from_program", False))
                slots.append(
                    EnvSlot(
                        spec,
                        size,
                        threshold,
                        num_tools=tools,
                        roles=roles,
                        tools_from_program=program,
                    )
                )
                if curriculum is not None and curriculum.levels is not None:
                    levels.append(_levels_of(env, slots[-1], index))
            finally:
                env.close()
        if curriculum is None:
            return cls(slots, seed)
        return cls(slots, seed, Curriculum(curriculum, levels or [None] * len(slots)))

    @property
    def pass_threshold(self) -> float:
        """The lowest of the envs' pass thresholds (a step's pass@1 counts against it)."""
        return min(slot.pass_threshold for slot in self.slots)

    def draw(self, step: int, count: int, extra: int = 0) -> list[list[int]]:
        """Task indices per env for ``step`` (``count`` in all); advances the cursors.

        ``extra`` > 0 draws the step's ``extra``-th batch of additional tasks (to replace
        groups without signal), from a stream of its own.
        """
        weights = self._weights()
        keys = [self.seed, step, 1, extra] if extra else [self.seed, step, 1]
        if self.curriculum is not None and self.curriculum.config.env_rule == "thompson":
            thompson = np.random.default_rng([*keys, 4])  # a stream of its own
            choices = self.curriculum.choose_envs(weights, count, thompson)
        else:
            rng = np.random.default_rng(keys)
            choices = rng.choice(len(self.slots), size=count, p=weights / weights.sum())
        per_env: list[list[int]] = [[] for _ in self.slots]
        if self.curriculum is None:
            for env_index in choices.tolist():
                per_env[env_index].append(self._next_task(env_index))
            return per_env
        curated = np.random.default_rng([*keys, 3])  # the curriculum's stream, apart
        for env_index in choices.tolist():
            per_env[env_index].append(self._next_curated(env_index, curated))
        return per_env

    def _weights(self) -> np.ndarray:
        """The envs' draw weights: as configured, each scaled by the curriculum's measure of
        how much it teaches now (:meth:`Curriculum.env_factor`); as configured if that leaves
        none."""
        weights = np.array([s.spec.weight for s in self.slots], dtype=np.float64)
        if self.curriculum is None:
            return weights
        scaled = weights * [self.curriculum.env_factor(i) for i in range(len(self.slots))]
        return scaled if scaled.sum() > 0 else weights

    def level(self, env_index: int) -> str | None:
        """The level env ``env_index`` is drawn at now (``None``: no curriculum levels)."""
        return self.curriculum.level(env_index) if self.curriculum is not None else None

    def _next_curated(self, env_index: int, rng: np.random.Generator) -> int:
        """The next task of the env's epoch order that the curriculum admits. After a whole
        epoch's worth of settled tasks passed over in a row, the next one is drawn anyway."""
        assert self.curriculum is not None
        level = self.curriculum.level(env_index)
        for _ in range(self._size(env_index, level)):
            task = self._next_task(env_index, level)
            if self.curriculum.admit((env_index, level, task), rng):
                return task
        task = self._next_task(env_index, level)
        self.curriculum.force((env_index, level, task))
        return task

    def observe_group(
        self,
        env_index: int,
        level: str | None,
        task: int,
        rewards: list[float],
        role: str | None = None,
    ) -> None:
        """Tell the curriculum (if any) the rewards of a scored group of ``task`` (of env
        ``env_index``, played at ``level``): of its one role, or of its role ``role``."""
        if self.curriculum is None or not rewards:
            return
        threshold = self.slots[env_index].pass_threshold
        taught = max(rewards) - min(rewards) > 1e-9  # a tied group has no advantage
        key, rate = (env_index, level, task), pass_rate(rewards, threshold)
        self.curriculum.observe(key, rate, role, taught)

    def curriculum_metrics(self) -> dict[str, float]:
        """``curriculum/*`` since the last call (none without a curriculum)."""
        if self.curriculum is None:
            return {}
        return self.curriculum.metrics(self._labels())

    def _labels(self) -> list[str]:
        """Each env's name in metrics: its name (an env reference's env name), ``name#i``
        where several envs share one."""
        names = [display_name(s.spec.name) for s in self.slots]
        return [n if names.count(n) == 1 else f"{n}#{i}" for i, n in enumerate(names)]

    def _size(self, env_index: int, level: str | None) -> int:
        slot = self.slots[env_index]
        return slot.size if level is None else slot.level_sizes[level]

    def _next_task(self, env_index: int, level: str | None = None) -> int:
        slot = self.slots[env_index]
        if level is None:
            cursor, slot.cursor = slot.cursor, slot.cursor + 1
        else:
            cursor = slot.level_cursors.get(level, 0)
            slot.level_cursors[level] = cursor + 1
        epoch, position = divmod(cursor, self._size(env_index, level))
        return int(self._permutation(env_index, epoch, level)[position])

    def _permutation(self, env_index: int, epoch: int, level: str | None = None) -> np.ndarray:
        key = (env_index, level, epoch)
        if key not in self._permutations:
            self._permutations.clear()  # only the current epoch is ever needed
            keys = [self.seed, env_index, epoch, 2]
            if level is not None:  # each level its own orders
                keys.append(1 + list(self.slots[env_index].level_sizes).index(level))
            rng = np.random.default_rng(keys)
            self._permutations[key] = rng.permutation(self._size(env_index, level))
        return self._permutations[key]

    def state_dict(self) -> dict[str, Any]:
        """The cursor of each env, for a checkpoint (the permutations follow from the seed);
        with a curriculum, also its statistics and levels, and the cursor of each level
        (:class:`ScheduleState`, JSON-ready)."""
        return ScheduleState(
            cursors=[s.cursor for s in self.slots],
            envs=[s.spec.name for s in self.slots],
            curriculum=self.curriculum.state_dict() if self.curriculum is not None else None,
            level_cursors=(
                [dict(s.level_cursors) for s in self.slots] if self.curriculum is not None else None
            ),
        ).to_json()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the cursors that :meth:`state_dict` saved.

        Raises:
            ConfigError: The checkpoint was made on other envs (names, in order; checkpoints
                from before the names were saved are checked by count only), or without the
                curriculum the config has.
        """
        saved = ScheduleState.from_json(state)
        names = [s.spec.name for s in self.slots]
        if len(saved.cursors) != len(self.slots) or saved.envs not in (None, names):
            made_on = saved.envs if saved.envs is not None else f"{len(saved.cursors)} envs"
            raise ConfigError(
                f"this run's folder has a checkpoint made on {made_on}, the config trains on "
                f"{names}: give the new run its own folder (logging.run_name=NAME) or start "
                "over in this one (checkpoint.resume=never)"
            )
        for slot, cursor in zip(self.slots, saved.cursors, strict=True):
            slot.cursor = cursor
        if self.curriculum is None:
            return
        if saved.curriculum is None or saved.level_cursors is None:
            raise ConfigError(
                "the checkpoint was made without a curriculum, the config has one: "
                "resume with the config the run was started with (or start a new run)"
            )
        self.curriculum.load_state_dict(saved.curriculum)
        for slot, level_cursors in zip(self.slots, saved.level_cursors, strict=True):
            slot.level_cursors = level_cursors


def _dataset_size(env: Env, name: str) -> int:
    """How many tasks ``env`` has to train on.

    Raises:
        ConfigError: It has none.
    """
    size = len(env.dataset) if hasattr(env, "dataset") else 0
    if size == 0:
        raise ConfigError(f"env {name!r} has no dataset of tasks to train on")
    return size


def _levels_of(env: Env, slot: EnvSlot, index: int) -> tuple[tuple[str, ...], str] | None:
    """An env's levels and the one its args select, learning each level's size (``None``: the
    env has no levels).

    Raises:
        ConfigError: The env's args select none of its levels, or it cannot be made at one.
    """
    names = tuple(getattr(env, "levels", ()) or ())
    if not names:
        return None
    where = f"envs.{index} ({slot.spec.name})"
    start = env.current_level()
    if start is None:
        raise ConfigError(
            f"{where}: its args select none of its levels ({', '.join(names)}), so "
            f"curriculum.levels cannot move it: select one with envs.{index}.args."
            f"{env.level_arg}, or turn curriculum.levels off"
        )
    slot.level_arg = env.level_arg
    for level in names:
        try:
            made = slot.factory(level)()
        except EnvhubError as e:
            raise ConfigError(
                f"{where} cannot be made at its level {level!r} ({e}): select its level with "
                f"envs.{index}.args.{env.level_arg} alone, or turn curriculum.levels off"
            ) from None
        try:
            slot.level_sizes[level] = _dataset_size(made, slot.spec.name)
        finally:
            made.close()
    return names, start
