"""What a run's checkpoint holds, decided in one place: its weights' files and one typed record.

A checkpoint of a training run is the :class:`CheckpointManager`'s folder filled from the run's
live parts (:class:`RunParts`: the loop's ``step.Run`` is one):

    the policy          its backend's model, optimizer and scheduler (``model/``, ``*.pt``)
    the critic          the same under ``critic/``, when the run has one
    trainer_state.json  a :class:`RunState`: the step, and each stateful part's own state

Every stateful part contributes through one Protocol, :class:`Stateful`
(``state_dict``/``load_state_dict``, JSON-ready): the task schedule (its cursors), the group
producer (its buffer and the tasks it had in flight), the rollout engine (its sampling state)
and the KL-in-reward controller (its coefficient). :class:`RunCheckpoints` saves them after a
step and puts them back on resume; the loop only says when.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal, Protocol

from envhub.errors import CheckpointError
from envhub.trainer.checkpoint.manager import CheckpointManager


class Stateful(Protocol):
    """A part of the run whose state a checkpoint keeps (JSON-ready)."""

    def state_dict(self) -> dict[str, Any] | None:
        """The state to keep (``None``: nothing)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on from a state :meth:`state_dict` returned."""
        ...


class Trainable(Protocol):
    """A model trained by the run (the policy's backend, the critic)."""

    def state(self) -> dict[str, Any]:
        """Its ``model``, ``optimizer`` and ``scheduler`` (and ``tokenizer``), as
        :meth:`CheckpointManager.save` takes them."""
        ...


@dataclass(frozen=True)
class RunState:
    """``trainer_state.json``: the loop's own state after ``step`` completed steps."""

    step: int
    """Steps done: the first step a resumed run takes is ``step + 1``."""
    schedule: dict[str, Any]
    """The task schedule's cursors."""
    producer: dict[str, Any] | None = None
    """The group producer's buffer and tasks in flight (older checkpoints: none)."""
    engine: dict[str, Any] | None = None
    """The rollout engine's sampling state (``None``: it keeps none)."""
    kl_controller: dict[str, Any] | None = None
    """The KL-in-reward coefficient, when the run charges KL in the reward."""

    def to_json(self) -> dict[str, Any]:
        """The JSON document (a ``kl_controller`` of ``None`` is left out, as runs without one
        always wrote it)."""
        data = asdict(self)
        if data["kl_controller"] is None:
            del data["kl_controller"]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any], where: Path) -> RunState:
        """Read a document :meth:`to_json` (or an older envhub) wrote.

        Raises:
            CheckpointError: ``step`` or ``schedule`` is missing.
        """
        missing = [name for name in ("step", "schedule") if name not in data]
        if missing:
            raise CheckpointError(
                f"{where}/trainer_state.json lacks {', '.join(missing)}: it was not written by "
                "an envhub training run; resume from another checkpoint or start a new run "
                "(checkpoint.resume=never)"
            )
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        return cls(**{**values, "step": int(values["step"])})


class RunParts(Protocol):
    """The live parts of a run that a checkpoint saves and restores."""

    @property
    def backend(self) -> Trainable:
        """The policy's weights, optimizer and scheduler."""
        ...

    @property
    def schedule(self) -> Stateful:
        """The task schedule (its cursors)."""
        ...

    @property
    def producer(self) -> Stateful:
        """The group producer (its buffer and the tasks in flight)."""
        ...

    @property
    def engine(self) -> Stateful:
        """The rollout engine (its sampling state)."""
        ...

    @property
    def kl_controller(self) -> Stateful | None:
        """The KL-in-reward coefficient's controller, when the run has one."""
        ...

    @property
    def critic(self) -> Trainable | None:
        """The value model, when the run has one."""
        ...


def capture(parts: RunParts, step: int) -> RunState:
    """The run's state after ``step`` completed steps."""
    kl = parts.kl_controller.state_dict() if parts.kl_controller is not None else None
    schedule = parts.schedule.state_dict()
    assert schedule is not None, "a task schedule always has cursors"
    return RunState(
        step=step,
        schedule=schedule,
        producer=parts.producer.state_dict(),
        engine=parts.engine.state_dict(),
        kl_controller=kl,
    )


def restore(parts: RunParts, state: RunState) -> None:
    """Put ``state`` back into the parts (what a part kept nothing of stays as it is)."""
    parts.schedule.load_state_dict(state.schedule)
    if state.producer is not None:
        parts.producer.load_state_dict(state.producer)
    if state.engine is not None:
        parts.engine.load_state_dict(state.engine)
    if parts.kl_controller is not None and state.kl_controller is not None:
        parts.kl_controller.load_state_dict(state.kl_controller)


class RunCheckpoints:
    """A training run's checkpoints: saved from its parts, and resumed into them.

    Args:
        manager: The folder of ``step-*`` checkpoints (atomic saves, rotation).
        parts: What each checkpoint holds.
    """

    def __init__(self, manager: CheckpointManager, parts: RunParts) -> None:
        self.manager = manager
        self.parts = parts

    def save(self, step: int) -> Path:
        """Save the run after ``step`` completed steps and return the checkpoint's folder."""
        critic = self.parts.critic.state() if self.parts.critic is not None else None
        return self.manager.save(
            step,
            **self.parts.backend.state(),
            trainer_state=capture(self.parts, step).to_json(),
            critic=critic,
        )

    def resume(self, choice: Literal["auto", "never"] | Path) -> int:
        """Load the checkpoint to continue from, if any, into the parts; returns the number of
        steps it had done (0: start from the beginning).

        Args:
            choice: ``auto`` (the latest complete checkpoint, if any), ``never``, or a
                checkpoint folder (``checkpoint.resume``).
        """
        if choice == "never":
            return 0
        path = self.manager.latest() if choice == "auto" else Path(choice)
        if path is None:
            return 0
        weights = self.parts.backend.state()
        document = self.manager.load(
            path,
            model=weights["model"],
            optimizer=weights["optimizer"],
            scheduler=weights["scheduler"],
            critic=self.parts.critic.state() if self.parts.critic is not None else None,
        )
        state = RunState.from_json(document, path)
        restore(self.parts, state)
        return state.step

    def latest(self) -> Path | None:
        """The checkpoint a rerun would resume from (``None``: none was saved)."""
        return self.manager.latest()
