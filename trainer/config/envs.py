"""What a run draws its tasks from: the envs trained on (``envs:``) and the online curriculum
(``curriculum:``, with its difficulty levels)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from envhub.trainer.config_base import ConfigPart as _Part
from envhub.trainer.config_base import EnvName


class EnvSpec(_Part):
    """One environment to train on."""

    name: EnvName
    """A registered env name (``envhub list``), a Hub reference, or an env's code:
    ``path/to/file.py:Class`` (or the file alone, when it defines one Env subclass; the path is
    stored absolute) or ``module:Class``."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for ``envhub.make``."""
    weight: float = Field(1.0, gt=0.0)
    """Share of each step's tasks drawn from this env (relative to the other envs)."""


class LevelsConfig(_Part):
    """Move each env's difficulty level from its measured pass rate (``curriculum.levels``).

    An env exposes levels with ``levels`` (names, easiest first) and ``level_arg`` (the
    constructor argument that selects one; see :class:`envhub.env.Env`). The run starts each
    such env at the level its ``args`` select (or the env's default) and measures the pass rate
    of its last ``window`` groups at that level: at or above ``promote_above`` it moves one
    level up, at or below ``demote_below`` one down. A move empties the window, so the next
    decision waits for ``window`` groups at the new level; with the gap between the bars this
    is the hysteresis that keeps a level from flapping. Envs without levels are left as they are.

    With ``signal: ties`` a group counts by what GRPO learns from it rather than by its pass
    rate: 1 when it tied with every sample passing (nothing left to learn: the level is easy),
    0 when it tied with none passing (nothing to learn: too hard), 0.5 when its rewards differed
    (it taught something, whatever its pass rate). The same bars then move the level only when
    most recent groups tie the same way (with 0.8 and 0.2, three in five or more), and a level
    whose groups still teach keeps the run there.
    """

    window: int = Field(16, ge=1)
    """Groups at the current level whose pass rates decide a move."""
    promote_above: float = Field(0.8, gt=0.0, le=1.0)
    demote_below: float = Field(0.2, ge=0.0, lt=1.0)
    signal: Literal["pass_rate", "ties"] = "pass_rate"
    """What a group adds to the window: its pass rate, or 1/0.5/0 for tied at success, taught,
    tied at failure (see above)."""

    @model_validator(mode="after")
    def _check_bars(self) -> LevelsConfig:
        if self.demote_below >= self.promote_above:
            raise ValueError(
                f"curriculum.levels.demote_below ({self.demote_below}) must be below "
                f"promote_above ({self.promote_above}): the gap between them is the hysteresis"
            )
        return self


class CurriculumConfig(_Part):
    """An online curriculum (``curriculum:``; off when absent): draw tasks that teach.

    The trainer keeps, per task (and level), the pass rates of its last ``window`` groups (the
    share of samples whose reward reaches the env's ``pass_threshold``). When a task comes up in
    its env's epoch order and its mean pass rate over at least ``min_groups`` groups is at or
    above ``skip_above`` (mastered) or at or below ``skip_below`` (hopeless), it is skipped,
    except with probability ``revisit``, when it is drawn again and its statistics refreshed.
    With ``env_window``, each env's weight is scaled by the share of its recent groups whose
    rewards differed, so an env whose unseen tasks will tie too is drawn less. Every
    choice comes from the run's seed and the step, and the statistics are in the checkpoint, so
    a resumed run draws what an uninterrupted one would. Held-out evaluation is unaffected. An
    env with several roles is tracked per task and role (:mod:`~envhub.trainer.curriculum`).
    """

    window: int = Field(4, ge=1)
    """Recent groups of a task whose pass rates are averaged."""
    min_groups: int = Field(1, ge=1)
    """Groups a task needs before it can be skipped."""
    skip_above: float = Field(1.0, gt=0.0, le=1.0)
    """Mean pass rate at or above which a task counts as mastered."""
    skip_below: float = Field(0.0, ge=0.0, lt=1.0)
    """Mean pass rate at or below which a task counts as hopeless."""
    revisit: float = Field(0.1, ge=0.0, le=1.0)
    """Probability that a mastered or hopeless task is drawn anyway when it comes up."""
    env_window: int = Field(0, ge=0)
    """Recent groups per env (at its current level) whose share that taught something (their
    rewards differed, so GRPO's advantages are not all zero) scales the env's weight: weight x
    (``revisit`` + (1 - ``revisit``) x share), once the env has ``window`` groups. An env whose
    groups all tie (seen tasks or not) is drawn less, one that teaches keeps its weight.
    Default 0: the configured weights (measured not to help yet: docs/guides/curricula.md)."""
    env_rule: Literal["share", "thompson"] = "share"
    """How ``env_window``'s counts choose envs: ``share`` scales each env's weight as above;
    ``thompson`` draws each task slot from the env whose sampled chance of teaching is highest
    (Thompson sampling: per env ``weight x Beta(1 + taught, 1 + tied)`` over its window, so an
    env is chosen with the probability that it teaches most), or with probability ``revisit``
    by the configured weights alone (so that an env given up on is looked at again)."""
    levels: LevelsConfig | None = None
    """Move envs' difficulty levels from their pass rates; none when absent."""

    @model_validator(mode="after")
    def _check_bars(self) -> CurriculumConfig:
        if self.skip_below >= self.skip_above:
            raise ValueError(
                f"curriculum.skip_below ({self.skip_below}) must be below skip_above "
                f"({self.skip_above}): tasks in between are the ones worth drawing"
            )
        if self.env_rule == "thompson" and not self.env_window:
            raise ValueError(
                "curriculum.env_rule: thompson chooses envs from their recent groups: set "
                "curriculum.env_window (e.g. 16)"
            )
        if self.min_groups > self.window:
            raise ValueError(
                f"curriculum.min_groups ({self.min_groups}) cannot exceed curriculum.window "
                f"({self.window}): a task keeps only its last window groups"
            )
        return self
