"""A step's episodes as jobs: what one rollout runner runs, wherever it runs.

Each step the producer turns the tasks it drew into one :class:`RolloutJob` per env: the tasks,
the runner's seed and the prefix of the group ids. :func:`run_job` runs a job with the SDK's
:class:`~envhub.rollout.runner.RolloutRunner`, as :class:`RunnerOptions` (from ``rollout:``)
say, and names each group ``{prefix}g{position of its task in the job}``. The producer runs
jobs in the trainer's process; rollout workers (``rollout_workers``, Ray actors) run shares of
them with the same function, so the trajectories are the same wherever they ran, up to the
engine's sampling.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from envhub.inference.base import InferenceEngine, SamplingParams
from envhub.rollout.runner import RolloutRunner
from envhub.trainer.config import RolloutConfig
from envhub.trainer.greedy_baselines import GREEDY_SEED_OFFSET, GreedyBaselines
from envhub.types import Trajectory


@dataclass(frozen=True)
class RolloutJob:
    """One env's episodes of a step: what one :class:`RolloutRunner` runs."""

    env_index: int
    """Which of ``config.envs``."""
    tasks: tuple[int, ...]
    """Task indices, one GRPO group each."""
    seed: int
    """The runner's seed (each episode's seed derives from it, the task and the sample)."""
    prefix: str
    """Group ids are ``{prefix}g{position of the task in tasks}``."""
    version: int = 0
    """The policy version the trainer's engine had when the job was launched: a worker's
    client cannot see syncs, so its turns carry this one (never newer than the truth)."""
    level: str | None = None
    """The env's difficulty level the curriculum drew the tasks at (``None``: as configured)."""
    env_args: dict[str, Any] | None = None
    """Constructor arguments over the env's configured ones (the level's), if any."""

    def env_factory(self, name: str, args: dict[str, Any]) -> Callable[[], Any]:
        """Makes this job's env: ``envhub.make(name, **args)`` with :attr:`env_args` on top."""
        import envhub

        merged = args | (self.env_args or {})
        return lambda: envhub.make(name, **merged)


@dataclass(frozen=True)
class RunnerOptions:
    """How every runner of a step samples and times out (from ``rollout``)."""

    sampling: SamplingParams
    samples_per_task: int
    max_concurrency: int
    step_timeout: float | None
    episode_timeout: float | None
    greedy_baseline: bool = False
    """Also play each task once greedily, as ReMax's baseline (``greedy_baselines``)."""

    @classmethod
    def from_config(cls, rc: RolloutConfig, greedy_baseline: bool = False) -> RunnerOptions:
        """The options of ``rollout`` (``rc``); sampling always asks for the sampler's logprobs,
        which the loss needs."""
        sampling = SamplingParams(
            temperature=rc.temperature,
            top_p=rc.top_p,
            top_k=rc.top_k,
            max_tokens=rc.max_tokens,
            logprobs=True,
        )
        return cls(
            sampling,
            rc.samples_per_task,
            rc.max_concurrency,
            rc.step_timeout,
            rc.episode_timeout,
            greedy_baseline,
        )

    def runner(
        self, engine: InferenceEngine, env_factory: Callable[[], Any], seed: int
    ) -> RolloutRunner:
        """A :class:`RolloutRunner` that samples as these options say."""
        return RolloutRunner(
            engine, env_factory, sampling=self.sampling, max_concurrency=self.max_concurrency,
            step_timeout=self.step_timeout, episode_timeout=self.episode_timeout, seed=seed,
        )  # fmt: skip

    def greedy(self) -> RunnerOptions:
        """These options at temperature 0, one sample per task (ReMax's baseline episodes)."""
        sampling = self.sampling.model_copy(update={"temperature": 0.0})
        return replace(self, sampling=sampling, samples_per_task=1, greedy_baseline=False)


async def run_job(
    engine: InferenceEngine,
    env_factory: Callable[[], Any],
    job: RolloutJob,
    options: RunnerOptions,
    on_trajectory: Callable[[Trajectory], None] | None = None,
    positions: Sequence[int] | None = None,
    on_group: Callable[[int, list[Trajectory]], None] | None = None,
) -> list[Trajectory]:
    """Roll out ``job`` (or, with ``positions``, the groups of the job at those positions, whose
    tasks ``job.tasks`` then lists) against ``engine``; group ids made unique per step.
    ``on_group(position, trajectories)`` is called as each group is scored, with its final ids.
    With ``options.greedy_baseline`` each task is also played greedily at the same time and
    every trajectory carries its task's ``baseline_reward`` (``greedy_baselines``).
    """
    positions = list(range(len(job.tasks)) if positions is None else positions)
    n = options.samples_per_task  # the runner returns them in task, then sample order
    baselines = GreedyBaselines(positions) if options.greedy_baseline else None
    if on_group is not None:
        handed = on_group if baselines is None else baselines.hold(on_group)
        on_trajectory = _grouped(on_trajectory, handed, job.prefix, positions, n)
    sampled = options.runner(engine, env_factory, job.seed).run(
        job.tasks, n, on_trajectory=on_trajectory
    )
    if baselines is None:
        trajectories = await sampled
    else:
        greedy = options.greedy().runner(engine, env_factory, job.seed + GREEDY_SEED_OFFSET)
        trajectories, _ = await asyncio.gather(
            sampled, greedy.run(job.tasks, 1, on_trajectory=baselines.baseline)
        )
    renamed = []
    for t in trajectories:  # g{k}: the k-th task (an episode with roles gives several)
        position = positions[int(t.group_id.removeprefix("g"))]
        update: dict[str, Any] = {"group_id": f"{job.prefix}g{position}"}
        if baselines is not None:
            update["baseline_reward"] = baselines.rewards[position]
        renamed.append(t.model_copy(update=update))
    return renamed


def _grouped(
    on_trajectory: Callable[[Trajectory], None] | None,
    on_group: Callable[[int, list[Trajectory]], None],
    prefix: str,
    positions: Sequence[int],
    n: int,
) -> Callable[[Trajectory], None]:
    """A per-trajectory callback that also hands on each group once its ``n`` episodes are in
    (the runner calls back a group's episodes together, as the group is scored; its group ids
    are ``g{k}`` for the job's k-th task). An episode with several roles yields one trajectory
    per actor the policy played (``info["actors"]`` of them)."""
    pending: dict[str, list[Trajectory]] = {}

    def collect(t: Trajectory) -> None:
        if on_trajectory is not None:
            on_trajectory(t)
        group = pending.setdefault(t.group_id, [])
        group.append(t)
        if _episodes_done(group) == n:
            del pending[t.group_id]
            position = positions[int(t.group_id.removeprefix("g"))]
            renamed = f"{prefix}g{position}"
            on_group(position, [e.model_copy(update={"group_id": renamed}) for e in group])

    return collect


def _episodes_done(group: list[Trajectory]) -> int:
    """Episodes of ``group`` whose every trajectory is in (one per actor it had)."""
    counts: dict[int, int] = {}
    for t in group:
        counts[t.sample_index] = counts.get(t.sample_index, 0) + 1
    wanted = {t.sample_index: int(t.info.get("actors", 1)) for t in group}
    return sum(counts[i] >= wanted[i] for i in counts)
