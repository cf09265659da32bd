"""Scored groups for the update, produced ahead of it within a bound on staleness.

One producer, one consumer (the update) and one buffer between them::

    draw s: schedule.draw(s) -> one RolloutJob per env -> each group as soon as it is scored
                                                                |
                                                           the buffer
                                                                |
    update u <- take(u): tasks_per_step groups, oldest first, none older than k versions

- **Bounded staleness.** Draw ``s`` starts once the engine samples from the policy of version
  ``s - k`` or newer (``k`` is ``rollout.max_staleness``; version ``u`` is the policy after ``u``
  updates), so at most ``k + 1`` draws run ahead of the update. Update ``u`` takes the first
  ``tasks_per_step`` groups that are ready, oldest policy first, so a long-tail episode does not
  hold it up; a group whose oldest token was sampled more than ``k`` versions before ``u`` is
  dropped, counted, and its task sampled again at once with the newest weights.
- **Refill.** With dynamic sampling and ``algorithm.dynamic_sampling_rounds`` > 1, a group whose
  rewards are all equal is set aside (its episodes still count in the step's metrics) and a new
  task takes its place, until the draw has sampled ``rounds x tasks_per_step`` groups.
- **Curriculum.** With ``curriculum:``, each update's groups (taken and set aside, in job order)
  are reported to the schedule's curriculum when the update takes them, so a draw sees the
  statistics of every update before the one it follows; each job carries the level its tasks
  were drawn at. The step's ``curriculum/*`` metrics come with the update's.
- **Checkpoints.** :meth:`state_dict` holds the groups waiting in the buffer and the tasks in
  flight (with their jobs' seeds): a resumed run trains on the former and samples the latter
  again; nothing is skipped.

With ``k = 0`` and one round this is the synchronous loop, exactly: draw ``u`` starts only once
update ``u - 1`` is synced, its jobs are the synchronous loop's jobs, update ``u`` waits for all
of its groups and lists them in job order, and a checkpoint holds nothing in flight.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from envhub.trainer.config import TrainConfig
from envhub.trainer.engines.base import RolloutEngine
from envhub.trainer.groups import (
    Group,
    IdleClock,
    InFlight,
    ProducerState,
    Taken,
    rewards_by_role,
)
from envhub.trainer.rollout_jobs import RolloutJob, RunnerOptions, run_job
from envhub.trainer.rollout_workers import RolloutWorkers
from envhub.trainer.scoring import has_signal
from envhub.trainer.tasks import TaskSchedule
from envhub.types import Trajectory

Land = Callable[[int, int, list[Trajectory]], None]
"""``land(env index, position, trajectories)``: one scored group arrives."""


class GroupProducer:
    """Rolls out the run's draws ahead of the update (see the module docstring).

    Args:
        config: The run (``rollout``: tasks, groups, staleness; ``steps``: the last draw).
        schedule: Hands out each draw's tasks.
        engine: Samples the episodes (in this process, or through ``workers``).
        workers: Ray actors that run the episodes, if the caller has them (it closes them);
            :meth:`start_workers` starts the run's own instead, which :meth:`aclose` closes.
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
        self._owns_workers = False
        self.on_progress = on_progress
        self.max_staleness = config.rollout.max_staleness
        self.groups_per_step = config.rollout.tasks_per_step
        self.options = RunnerOptions.from_config(
            config.rollout, greedy_baseline="baselines" in config.algorithm.estimator.inputs
        )
        algorithm = config.algorithm
        self.refill = algorithm.dynamic_sampling and algorithm.dynamic_sampling_rounds > 1
        self.budget = self.groups_per_step * algorithm.dynamic_sampling_rounds
        """Groups a draw may sample in all, refills included."""
        self.ready: list[Group] = []
        self.set_aside: list[Group] = []
        self.next_draw = 0
        self.waiting = False
        """True while :meth:`take` waits: no update is under way."""
        self._stale = 0
        self._again = 0
        self._sampled: dict[int, int] = {}
        """Groups each draw has sampled so far (refills included)."""
        self._refills: dict[int, int] = {}
        self._in_flight: dict[tuple[int, int, int, int], InFlight] = {}
        self._tasks: set[asyncio.Future[None]] = set()
        self._changed = asyncio.Event()
        self._failure: BaseException | None = None
        self._idle = IdleClock()
        self._episodes = 0
        """Episodes finished and not taken yet (for progress)."""
        self._relaunch: list[InFlight] = []
        """Tasks a checkpoint had in flight, to launch again at :meth:`start`."""

    # -- the producer ---------------------------------------------------------------------------

    def start_workers(self, cores: Sequence[int] | None = None) -> list[dict[str, Any]] | None:
        """Start the run's ``rollout.workers`` Ray actors, which reach the started engine over
        HTTP (on ``cores`` of this node when given: the engine's share of the core split);
        :meth:`aclose` closes them. Returns where each runs (``None``: the run has none, and
        episodes run in this process)."""
        if not self.config.rollout.workers:
            return None
        self.workers = RolloutWorkers.for_run(self.config, self.engine, cores)
        self._owns_workers = True
        return self.workers.info

    def engine_stats(self) -> dict[str, float]:
        """The engine's counters since the last call (from the workers' clients when they
        sample; the CPU time of the server, ``cpu_s``, from the engine), then the engine's
        reset."""
        stats = self.engine.stats()
        if self.workers is not None:
            stats = self.workers.stats() | {k: v for k, v in stats.items() if k == "cpu_s"}
        self.engine.reset_stats()
        return stats

    def start(self, first_draw: int) -> None:
        """Begin with draw ``first_draw`` (a resumed run's first step), or where a checkpoint's
        state left off (:meth:`load_state_dict`): its tasks in flight are launched again first,
        as their jobs were, with the engine's current weights."""
        self.next_draw = max(self.next_draw, first_draw)
        for flight in self._relaunch:
            job = replace(flight.job, version=self.engine.weights_version)
            self._launch([job], flight.draw, flight.again, positions=[flight.position])
        self._relaunch = []
        self.advance()

    @property
    def busy(self) -> bool:
        """Whether any task is rolling out now (at ``max_staleness: 0`` and one sampling
        round, never between updates)."""
        return bool(self._in_flight)

    def advance(self) -> None:
        """Launch every draw the engine's policy version allows."""
        version = self.engine.weights_version
        while (
            self.next_draw < self.config.total_steps
            and version >= self.next_draw - self.max_staleness
        ):
            self._launch_draw(self.next_draw)
            self.next_draw += 1

    def _launch_draw(self, draw: int) -> None:
        self._sampled[draw] = self.groups_per_step
        self._launch_tasks(draw, self.schedule.draw(draw, self.groups_per_step), again=0)

    def _launch_tasks(
        self,
        draw: int,
        per_env: list[list[int]],
        again: int,
        positions: list[int] | None = None,
        level: str | None = None,
    ) -> None:
        """One job per env, as the synchronous loop makes them, at each env's current level
        (``level``: that one instead, for a single task launched again)."""
        jobs = []
        for env_index, tasks in enumerate(per_env):
            if tasks:
                prefix = f"s{draw + 1}{f'r{again}' if again else ''}e{env_index}"
                seed = runner_seed(self.config.seed, draw, env_index, *([again] if again else []))
                at = level if positions else self.schedule.level(env_index)
                jobs.append(self._job(env_index, tasks, seed, prefix, at))
        self._launch(jobs, draw, again, positions)

    def _job(
        self, env_index: int, tasks: list[int], seed: int, prefix: str, level: str | None
    ) -> RolloutJob:
        version = self.engine.weights_version  # workers' turns carry it: never newer than true
        args = self.schedule.slots[env_index].level_args(level) or None
        return RolloutJob(
            env_index, tuple(tasks), seed=seed, prefix=prefix, version=version,
            level=level, env_args=args,
        )  # fmt: skip

    def _sample_again(self, group: Group) -> None:
        """A stale group's task, again with the newest weights and new seeds."""
        self._again += 1
        task = group.trajectories[0].task_index
        per_env: list[list[int]] = [[] for _ in self.schedule.slots]
        per_env[group.env_index] = [task]
        self._launch_tasks(
            group.draw, per_env, self._again, positions=[group.position], level=group.level
        )

    def _has_signal(self, trajectories: list[Trajectory]) -> bool:
        return has_signal(trajectories, self.config.algorithm, self.config.rollout.max_tokens)

    def _replace(self, group: Group) -> None:
        """A group without signal gives its place to a new task, while the draw's budget lasts;
        after that it stays and the update's own filter drops it."""
        if self._sampled[group.draw] >= self.budget:
            self.ready.append(group)
            return
        self.set_aside.append(group)
        self._sampled[group.draw] += 1
        self._refills[group.draw] = self._refills.get(group.draw, 0) + 1
        self._again += 1
        per_env = self.schedule.draw(group.draw, 1, extra=self._refills[group.draw])
        self._launch_tasks(group.draw, per_env, self._again)

    def _launch(
        self, jobs: list[RolloutJob], draw: int, again: int, positions: list[int] | None
    ) -> None:
        """Roll out ``jobs`` meanwhile (``positions``: of a single task launched again)."""
        for job in jobs:
            for k, task in enumerate(job.tasks):
                at = positions[k] if positions else k
                key = (draw, again, job.env_index, at)
                self._in_flight[key] = InFlight(draw, _only(job, task, at), at, again)
        future = asyncio.ensure_future(self._run(jobs, draw, again, positions))
        self._tasks.add(future)
        future.add_done_callback(self._tasks.discard)

    async def _run(
        self, jobs: list[RolloutJob], draw: int, again: int, positions: list[int] | None
    ) -> None:
        left = sum(len(job.tasks) for job in jobs)
        self._idle.begin(left)
        levels = {job.env_index: job.level for job in jobs}  # one job per env

        def land(env_index: int, at: int, trajectories: list[Trajectory]) -> None:
            nonlocal left
            self._in_flight.pop((draw, again, env_index, at), None)
            group = Group(draw, env_index, at, trajectories, again, levels[env_index])
            if not self.refill or self._has_signal(trajectories):
                self.ready.append(group)
            else:
                self._replace(group)
            left -= 1
            self._idle.end(1)
            self._changed.set()

        try:
            await self._roll_out(jobs, land, positions)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a dead engine or worker: the next take() raises it
            self._failure = self._failure or e
            self._changed.set()
        finally:
            self._idle.end(left)

    async def _roll_out(
        self, jobs: list[RolloutJob], land: Land, positions: list[int] | None
    ) -> None:
        """Roll out ``jobs`` and ``land`` each group as it is scored (from workers: as their
        share of the jobs comes back). ``positions``: of a one-task job launched again, which
        keeps the id its group would have had (``{prefix}g{position}``)."""
        if self.workers is not None:
            return await self._roll_out_in_workers(self.workers, jobs, land, positions)
        runs = []
        for job in jobs:
            factory = self.schedule.slots[job.env_index].factory(job.level)
            on_group = _landing(land, job.env_index)
            count = _counting(self._count)
            runs.append(
                run_job(
                    self.engine,
                    factory,
                    job,
                    self.options,
                    count,
                    positions=positions,
                    on_group=on_group,
                )
            )
        await asyncio.gather(*runs)

    async def _roll_out_in_workers(
        self,
        workers: RolloutWorkers,
        jobs: list[RolloutJob],
        land: Land,
        positions: list[int] | None,
    ) -> None:
        """:meth:`_roll_out` on Ray workers: the groups land when the workers' calls return."""
        done_before = 0

        def progress(done: int) -> None:
            nonlocal done_before
            self._count(done - done_before)
            done_before = done

        flat = await workers.run(jobs, self.options, on_progress=progress)
        # Named as run_job names them, in job then task order (an episode with roles gives
        # one trajectory per actor, so a group's size is not always samples_per_task).
        groups = (list(g) for _, g in itertools.groupby(flat, key=lambda t: t.group_id))
        for job in jobs:
            for k in range(len(job.tasks)):
                at = positions[k] if positions else k
                named = f"{job.prefix}g{at}"
                land(
                    job.env_index,
                    at,
                    [t.model_copy(update={"group_id": named}) for t in next(groups)],
                )

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
        self.advance()
        self.waiting = True  # stays True if the wait is cancelled: the run stopped between updates
        while True:
            if self._failure is not None:
                self.waiting = False
                raise self._failure
            self._drop_stale(step)
            if len(self.ready) >= self.groups_per_step:
                break
            self._changed.clear()
            await self._changed.wait()
        self.waiting = False
        ahead = len(self.ready) + self._idle.running - self.groups_per_step
        self.ready.sort(key=lambda g: (_or(g.version, step), g.order))
        taken, self.ready = self.ready[: self.groups_per_step], self.ready[self.groups_per_step :]
        taken.sort(key=lambda g: g.order)
        aside, self.set_aside = self.set_aside, []
        self._episodes = max(0, self._episodes - len(taken) * self.options.samples_per_task)
        self._forget_done_draws(step)
        self._observe(sorted(taken + aside, key=lambda g: g.order))
        return Taken(
            [t for g in taken for t in g.trajectories],
            [t for g in aside for t in g.trajectories],
            self._metrics(step, taken, aside, ahead),
        )

    def _observe(self, groups: list[Group]) -> None:
        """Report the groups an update takes to the curriculum (if any), in job order, each
        role's rewards apart for an env with several (:func:`rewards_by_role`)."""
        for group in groups:
            task = group.trajectories[0].task_index
            for role, rewards in rewards_by_role(group.trajectories).items():
                self.schedule.observe_group(group.env_index, group.level, task, rewards, role)

    def _drop_stale(self, step: int) -> None:
        """Drop the ready groups too old for update ``step``; sample their tasks again."""
        fresh = []
        for group in self.ready:
            if group.version is not None and step - group.version > self.max_staleness:
                self._stale += 1
                self._episodes = max(0, self._episodes - len(group.trajectories))
                self._sample_again(group)
            else:
                fresh.append(group)
        self.ready = fresh

    def _forget_done_draws(self, step: int) -> None:
        """Budgets of draws that can have no more groups on the way."""
        live = {g.draw for g in self.ready} | {f.draw for f in self._in_flight.values()}
        for draw in [d for d in self._sampled if d <= step and d not in live]:
            self._sampled.pop(draw)
            self._refills.pop(draw, None)

    def _metrics(
        self, step: int, taken: list[Group], aside: list[Group], ahead: int
    ) -> dict[str, float]:
        """``batch/refilled_groups`` (with refills) and, when asynchronous, ``async/*``: how
        stale the update's data was and how busy the rollouts were."""
        metrics = {"batch/refilled_groups": float(len(aside))} if self.refill else {}
        metrics |= self.schedule.curriculum_metrics()
        if not self.max_staleness:
            return metrics
        versions = [t.policy_version for g in taken for t in g.trajectories]
        ages = [step - v for v in versions if v is not None]
        metrics |= {
            "async/staleness_mean": float(np.mean(ages)) if ages else 0.0,
            "async/staleness_max": float(max(ages, default=0)),
            "async/stale_groups": float(self._stale),
            "async/groups_ahead": float(ahead),
            "async/rollout_idle_s": self._idle.lap(),
        }
        for age in range(self.max_staleness + 1):
            metrics[f"async/staleness_{age}"] = float(sum(a == age for a in ages))
        self._stale = 0
        return metrics

    # -- checkpoints and shutdown ---------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps (:class:`~envhub.trainer.groups.ProducerState`, JSON-ready)."""
        return ProducerState(
            next_draw=self.next_draw,
            again=self._again,
            sampled=dict(self._sampled),
            refills=dict(self._refills),
            ready=list(self.ready),
            set_aside=list(self.set_aside),
            in_flight=list(self._in_flight.values()),
        ).to_json()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on from :meth:`state_dict`: the buffer as it was; the tasks that were in flight
        are launched again (same jobs and seeds) when the run starts."""
        saved = ProducerState.from_json(state)
        self.next_draw, self._again = saved.next_draw, saved.again
        self._sampled, self._refills = saved.sampled, saved.refills
        self.ready, self.set_aside = saved.ready, saved.set_aside
        self._relaunch = saved.in_flight

    async def aclose(self) -> None:
        """Cancel the rollouts in flight and wait for them to stop; close the workers that
        :meth:`start_workers` started."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._owns_workers and self.workers is not None:
            self._owns_workers = False
            await self.workers.aclose()


def runner_seed(seed: int, *keys: int) -> int:
    """A runner's seed from the run's seed and the draw, env (and relaunch) it serves."""
    return int(np.random.SeedSequence([seed, *keys]).generate_state(1)[0])


def _only(job: RolloutJob, task: int, position: int) -> RolloutJob:
    """``job`` reduced to its task at ``position`` (ids and seeds as in the whole job)."""
    return replace(job, tasks=(task,))


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def _landing(land: Land, env_index: int) -> Callable[[int, list[Trajectory]], None]:
    """``run_job``'s ``on_group`` for a job of env ``env_index``."""
    return lambda position, trajectories: land(env_index, position, trajectories)


def _counting(count: Callable[[int], None]) -> Callable[[Trajectory], None]:
    """``run_job``'s ``on_trajectory``: one more episode finished."""
    return lambda _: count(1)
