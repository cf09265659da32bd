"""What the producer hands the update: scored groups, and its own bookkeeping types.

:class:`Group` is one task's scored episodes with where they come from (plain values in a
checkpoint); :class:`InFlight` a task being rolled out (enough to launch it again after a
restart); :class:`Taken` what one update gets; :class:`IdleClock` how long nothing was being
rolled out.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from envhub.trainer.rollout_jobs import RolloutJob
from envhub.types import TRAINED_OUTCOMES, Trajectory


@dataclass
class Group:
    """One task's scored episodes, and where they come from."""

    draw: int
    """The step whose draw the task belongs to."""
    env_index: int
    position: int
    """The group's place in its job (its id ends in ``g{position}``)."""
    trajectories: list[Trajectory]
    again: int = 0
    """0 for a task as drawn; ``n`` for the n-th task launched again or instead (a stale group
    sampled again, a refill, a task in flight at a checkpoint)."""
    level: str | None = None
    """The env's difficulty level the task was played at (a curriculum's; else ``None``)."""

    @property
    def version(self) -> int | None:
        """The oldest policy version that sampled any of its turns."""
        versions = [t.policy_version for t in self.trajectories if t.policy_version is not None]
        return min(versions) if versions else None

    @property
    def order(self) -> tuple[int, int, int, int]:
        """Where it goes in a batch: as the synchronous loop lists its jobs' groups."""
        return (self.draw, self.again, self.env_index, self.position)

    def to_dict(self) -> dict[str, Any]:
        """Plain values, for a checkpoint."""
        return {
            "draw": self.draw,
            "env_index": self.env_index,
            "position": self.position,
            "again": self.again,
            "trajectories": [t.model_dump(mode="json") for t in self.trajectories],
            "level": self.level,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Group:
        """The group :meth:`to_dict` saved."""
        trajectories = [Trajectory.model_validate(t) for t in data["trajectories"]]
        return cls(
            data["draw"],
            data["env_index"],
            data["position"],
            trajectories,
            data["again"],
            data.get("level"),
        )


def rewards_by_role(trajectories: list[Trajectory]) -> dict[str | None, list[float]]:
    """A group's rewards that say something of its task, per role (``None``: a one-role env),
    roles in the order they first appear.

    An episode lost to the infrastructure (engine, sandbox, network) says nothing of the task.
    With several roles, only the trajectories the trainer learns from count
    (:data:`~envhub.types.TRAINED_OUTCOMES`): a role whose episode another role's crash cut
    short was not measured. (A one-role env's other failures count as before roles, as 0.)
    """
    out: dict[str | None, list[float]] = {}
    for t in trajectories:
        measured = t.outcome != "infra_failure" if t.role is None else t.outcome in TRAINED_OUTCOMES
        if measured:
            out.setdefault(t.role_name, []).append(t.reward)
    return out


@dataclass(frozen=True)
class InFlight:
    """A task being rolled out: enough to launch it again after a restart."""

    draw: int
    job: RolloutJob
    """Its job, reduced to this one task."""
    position: int
    again: int


@dataclass
class Taken:
    """What one update gets."""

    trajectories: list[Trajectory]
    """The groups to train on, in job order."""
    set_aside: list[Trajectory] = field(default_factory=list)
    """Groups without signal that refills replaced: in the step's metrics, not in the loss."""
    metrics: dict[str, float] = field(default_factory=dict)


class IdleClock:
    """Seconds during which no group was being rolled out, between :meth:`lap` calls."""

    def __init__(self) -> None:
        self.running = 0
        self._idle = 0.0
        self._since = time.perf_counter()

    def begin(self, groups: int) -> None:
        """``groups`` start."""
        if self.running == 0 and groups:
            self._idle += time.perf_counter() - self._since
        self.running += groups

    def end(self, groups: int) -> None:
        """``groups`` are done."""
        self.running -= groups
        if self.running == 0 and groups:
            self._since = time.perf_counter()

    def lap(self) -> float:
        """Idle seconds since the previous lap."""
        now = time.perf_counter()
        idle = self._idle + (now - self._since if self.running == 0 else 0.0)
        self._idle, self._since = 0.0, now
        return idle


@dataclass
class ProducerState:
    """What a checkpoint keeps of the group producer: where the draws are, the groups in its
    buffer, and the tasks in flight (launched again, same jobs and seeds, on resume)."""

    next_draw: int
    again: int
    """Tasks sampled again so far (each such launch's seed offset)."""
    sampled: dict[int, int]
    """Per draw still open, groups launched for it."""
    refills: dict[int, int]
    """Per draw still open, groups drawn anew for it."""
    ready: list[Group]
    set_aside: list[Group]
    in_flight: list[InFlight]

    def to_json(self) -> dict[str, Any]:
        """Plain values (a JSON object's keys are strings, so the draws' are too)."""
        return {
            "next_draw": self.next_draw,
            "again": self.again,
            "sampled": {str(d): n for d, n in self.sampled.items()},
            "refills": {str(d): n for d, n in self.refills.items()},
            "ready": [g.to_dict() for g in self.ready],
            "set_aside": [g.to_dict() for g in self.set_aside],
            "in_flight": [
                {**asdict(f), "job": {**asdict(f.job), "tasks": list(f.job.tasks)}}
                for f in self.in_flight
            ],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProducerState:
        """The state :meth:`to_json` wrote."""
        return cls(
            next_draw=int(data["next_draw"]),
            again=int(data["again"]),
            sampled={int(d): int(n) for d, n in data["sampled"].items()},
            refills={int(d): int(n) for d, n in data["refills"].items()},
            ready=[Group.from_dict(g) for g in data["ready"]],
            set_aside=[Group.from_dict(g) for g in data["set_aside"]],
            in_flight=[
                InFlight(
                    f["draw"],
                    RolloutJob(**{**f["job"], "tasks": tuple(f["job"]["tasks"])}),
                    f["position"],
                    f["again"],
                )
                for f in data["in_flight"]
            ],
        )
