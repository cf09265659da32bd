"""Scored groups for the update, produced ahead of it within a bound on staleness.

One producer, one consumer (the update) and one buffer between them::

    draw s: schedule.draw(s) -> one RolloutJob per env -> each group as soon as it is scored
                                                                |
                                                           the buffer
                                                                |
    update u <- take(u): tasks_per_step groups, oldest first, none older than k versions

The producer launches draw ``s`` as soon as the engine samples from the policy of version
``s - k`` or newer (``k`` is ``rollout.max_staleness``; version ``u`` is the policy after ``u``
updates), so at most ``k + 1`` draws run ahead of the update. The update of step ``u`` takes the
first ``tasks_per_step`` groups that are ready, oldest policy first, so a long-tail episode does
not hold the step up; a group whose oldest token was sampled more than ``k`` versions before
``u`` is dropped, counted, and its task sampled again at once with the newest weights.

With ``k = 0`` this is the synchronous loop, exactly: draw ``u`` starts only once update
``u - 1`` has been synced, its jobs are today's jobs, and update ``u`` waits for all of its
groups, which it lists in job order. Every test of the synchronous loop tests this code.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from envhub.trainer.config import TrainConfig
from envhub.trainer.engines.base import RolloutEngine
from envhub.trainer.rollout_workers import RolloutJob, RolloutWorkers, RunnerOptions, run_job
from envhub.trainer.tasks import TaskSchedule
from envhub.types import Trajectory

Land = Callable[[int, int, list[Trajectory]], None]
"""``land(env index, position, trajectories)``: one scored group arrives."""


@dataclass
class Group:
    """One task's scored episodes, and where they come from."""

    draw: int
    """The step whose draw the task came from."""
    env_index: int
    position: int
    """The group's place in its job (its id ends in ``g{position}``)."""
    trajectories: list[Trajectory]
    resampled: int = 0
    """0 for a drawn task; ``n`` for the n-th task sampled again after a stale group."""

    @property
    def version(self) -> int | None:
        """The oldest policy version that sampled any of its turns."""
        versions = [t.policy_version for t in self.trajectories if t.policy_version is not None]
        return min(versions) if versions else None

    @property
    def order(self) -> tuple[int, int, int, int]:
        """Where it goes in a batch: as the synchronous loop lists its jobs' groups."""
        return (self.draw, self.resampled, self.env_index, self.position)


@dataclass
class Taken:
    """What one update gets: its groups' trajectories and how stale they were."""

    trajectories: list[Trajectory]
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


class GroupProducer:
    """Rolls out the run's draws ahead of the update (see the module docstring).

    Args:
        config: The run (``rollout``: tasks, groups, staleness; ``steps``: the last draw).
        schedule: Hands out each draw's tasks.
        engine: Samples the episodes (in this process, or through ``workers``).
        workers: Ray actors that run the episodes, if the run has them.
        on_progress: Called with (episodes ready for the next update, episodes it needs).
    """

    def __init__(
        self,
        config: TrainConfig,
        schedule: TaskSchedule,
        engine: RolloutEngine,
        workers: RolloutWorkers | None = None,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.config = config
        self.schedule = schedule
        self.engine = engine
        self.workers = workers
        self.on_progress = on_progress
        self.max_staleness = config.rollout.max_staleness
        self.groups_per_step = config.rollout.tasks_per_step
        self.options = RunnerOptions.from_config(config.rollout)
        self.ready: list[Group] = []
        self.next_draw = 0
        self.stale_groups = 0
        """Groups dropped as too stale since the last :meth:`take`."""
        self._resamples = 0
        self._tasks: set[asyncio.Future[None]] = set()
        self._changed = asyncio.Event()
        self._failure: BaseException | None = None
        self._idle = IdleClock()
        self._episodes = 0
        """Episodes finished and not taken yet (for progress)."""
        self._cursors: dict[int, dict[str, Any]] = {}
        """The schedule's state before each draw that still has groups to give."""
        self._outstanding: dict[int, int] = {}
        """Groups of each draw not taken yet (in flight, ready, or being sampled again)."""

    # -- the producer ---------------------------------------------------------------------------

    def start(self, first_draw: int) -> None:
        """Begin with draw ``first_draw`` (a resumed run's first step)."""
        self.next_draw = first_draw
        self.advance()

    def advance(self) -> None:
        """Launch every draw the engine's policy version now allows (call it after a sync)."""
        version = self.engine.weights_version
        while self.next_draw < self.config.steps and version >= self.next_draw - self.max_staleness:
            self._launch_draw(self.next_draw)
            self.next_draw += 1

    def _launch_draw(self, draw: int) -> None:
        self._cursors[draw] = self.schedule.state_dict()
        self._outstanding[draw] = self.groups_per_step
        per_env = self.schedule.draw(draw, self.groups_per_step)
        seed = self.config.seed
        jobs = [
            self._job(i, tasks, runner_seed(seed, draw, i), prefix=f"s{draw + 1}e{i}")
            for i, tasks in enumerate(per_env)
            if tasks
        ]
        self._launch(jobs, draw, resampled=0)

    def _resample(self, group: Group) -> None:
        """Sample a dropped group's task again, with the newest weights (and new seeds: the
        dropped episodes must not simply repeat)."""
        self._resamples += 1
        task = group.trajectories[0].task_index
        prefix = f"s{group.draw + 1}r{self._resamples}e{group.env_index}"
        seed = runner_seed(self.config.seed, group.draw, group.env_index, self._resamples)
        job = self._job(group.env_index, [task], seed, prefix)
        self._launch([job], group.draw, self._resamples, position=group.position)

    def _job(self, env_index: int, tasks: list[int], seed: int, prefix: str) -> RolloutJob:
        version = self.engine.weights_version  # workers' turns carry it: never newer than true
        return RolloutJob(env_index, tuple(tasks), seed=seed, prefix=prefix, version=version)

    def _launch(
        self, jobs: list[RolloutJob], draw: int, resampled: int, position: int | None = None
    ) -> None:
        """Roll out ``jobs`` (a draw, or one task sampled again for ``position``) meanwhile."""
        task = asyncio.ensure_future(self._run(jobs, draw, resampled, position))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(
        self, jobs: list[RolloutJob], draw: int, resampled: int, position: int | None
    ) -> None:
        left = sum(len(job.tasks) for job in jobs)
        self._idle.begin(left)

        def land(env_index: int, at: int, trajectories: list[Trajectory]) -> None:
            nonlocal left
            at = at if position is None else position
            self.ready.append(Group(draw, env_index, at, trajectories, resampled))
            left -= 1
            self._idle.end(1)
            self._changed.set()

        try:
            await self._roll_out(jobs, land)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a dead engine or worker: the next take() raises it
            self._failure = self._failure or e
            self._changed.set()
        finally:
            self._idle.end(left)

    async def _roll_out(self, jobs: list[RolloutJob], land: Land) -> None:
        """Roll out ``jobs`` and ``land`` each group as it is scored (from workers: as their
        share of the jobs comes back)."""
        n = self.options.samples_per_task
        if self.workers is not None:
            done_before = 0

            def progress(done: int) -> None:
                nonlocal done_before
                self._count(done - done_before)
                done_before = done

            flat = await self.workers.run(jobs, self.options, on_progress=progress)
            offset = 0
            for job in jobs:
                for k in range(len(job.tasks)):
                    land(job.env_index, k, flat[offset : offset + n])
                    offset += n
            return
        runs = []
        for job in jobs:
            factory = self.schedule.slots[job.env_index].factory()
            on_group = _landing(land, job.env_index)
            count = _counting(self._count)
            runs.append(run_job(self.engine, factory, job, self.options, count, on_group=on_group))
        await asyncio.gather(*runs)

    def _count(self, episodes: int) -> None:
        self._episodes += episodes
        if self.on_progress is not None:
            need = self.groups_per_step * self.options.samples_per_task
            self.on_progress(min(self._episodes, need), need)

    # -- the consumer ---------------------------------------------------------------------------

    async def take(self, step: int) -> Taken:
        """The groups of update ``step``, as soon as ``tasks_per_step`` of them are ready.

        Raises:
            Exception: What a rollout raised (a dead engine or worker); the run stops.
        """
        while True:
            if self._failure is not None:
                raise self._failure
            self._drop_stale(step)
            if len(self.ready) >= self.groups_per_step:
                break
            self._changed.clear()
            await self._changed.wait()
        ahead = len(self.ready) + self._idle.running - self.groups_per_step
        self.ready.sort(key=lambda g: (_or(g.version, step), g.order))
        taken, self.ready = self.ready[: self.groups_per_step], self.ready[self.groups_per_step :]
        taken.sort(key=lambda g: g.order)
        for group in taken:
            self._settle(group.draw)
        self._episodes = max(0, self._episodes - len(taken) * self.options.samples_per_task)
        return Taken([t for g in taken for t in g.trajectories], self._metrics(step, taken, ahead))

    def _settle(self, draw: int) -> None:
        """One group of ``draw`` is taken; forget the draw once all of them are."""
        self._outstanding[draw] -= 1
        if not self._outstanding[draw]:
            del self._outstanding[draw], self._cursors[draw]

    def _drop_stale(self, step: int) -> None:
        """Drop the ready groups too old for update ``step``; sample their tasks again."""
        fresh = []
        for group in self.ready:
            if group.version is not None and step - group.version > self.max_staleness:
                self.stale_groups += 1
                self._episodes = max(0, self._episodes - len(group.trajectories))
                self._resample(group)
            else:
                fresh.append(group)
        self.ready = fresh

    def _metrics(self, step: int, taken: list[Group], ahead: int) -> dict[str, float]:
        """``async/*``: how stale the update's data was and how busy the rollouts were (only
        when asynchronous: at ``k = 0`` there is nothing to say)."""
        if not self.max_staleness:
            return {}
        versions = [t.policy_version for g in taken for t in g.trajectories]
        ages = [step - v for v in versions if v is not None]
        metrics = {
            "async/staleness_mean": float(np.mean(ages)) if ages else 0.0,
            "async/staleness_max": float(max(ages, default=0)),
            "async/stale_groups": float(self.stale_groups),
            "async/groups_ahead": float(ahead),
            "async/rollout_idle_s": self._idle.lap(),
        }
        for age in range(self.max_staleness + 1):
            metrics[f"async/staleness_{age}"] = float(sum(a == age for a in ages))
        self.stale_groups = 0
        return metrics

    # -- checkpoints and shutdown ---------------------------------------------------------------

    def schedule_state(self) -> dict[str, Any]:
        """The task schedule as of the oldest draw with groups not taken yet: a run resumed
        from it draws those tasks again rather than skipping them (at ``k = 0``, after an
        update, that is the schedule after the update's own draw, as in the synchronous loop).
        """
        if not self._outstanding:
            return self.schedule.state_dict()
        return self._cursors[min(self._outstanding)]

    async def aclose(self) -> None:
        """Cancel the rollouts in flight and wait for them to stop."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def runner_seed(seed: int, *keys: int) -> int:
    """A runner's seed from the run's seed and the draw, env (and resampling) it serves."""
    return int(np.random.SeedSequence([seed, *keys]).generate_state(1)[0])


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def _landing(land: Land, env_index: int) -> Callable[[int, list[Trajectory]], None]:
    """``run_job``'s ``on_group`` for a job of env ``env_index``."""
    return lambda position, trajectories: land(env_index, position, trajectories)


def _counting(count: Callable[[int], None]) -> Callable[[Trajectory], None]:
    """``run_job``'s ``on_trajectory``: one more episode finished."""
    return lambda _: count(1)
