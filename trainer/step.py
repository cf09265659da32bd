"""One training step, phase by phase.

    take groups -> record them -> score -> (engine sleeps) -> KL in the reward -> values
      -> advantages and batch -> update the policy (and the critic) -> sync the engine

:func:`train_step` reads top to bottom; each phase is a function of its own, timed under its
name (``time/<phase>`` metrics). The update runs in a worker thread, so that the producer's
rollouts (with ``rollout.max_staleness >= 1``) go on meanwhile; at 0 nothing is rolling out
then.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from envhub.evaluation import summarize
from envhub.rollout.io import TrajectoryWriter
from envhub.rollout.manifest import update_manifest
from envhub.trainer import trainer_logprobs
from envhub.trainer.algorithms import KLController, ObjectiveSpec
from envhub.trainer.backends import TrainBackend
from envhub.trainer.batch import Batch, NoSignal, Sample, no_signal, select
from envhub.trainer.config import TrainConfig
from envhub.trainer.cores import CoreSplit, ThreadBalancer
from envhub.trainer.critic import Critic, update_critic
from envhub.trainer.engines.base import RolloutEngine
from envhub.trainer.groups import Taken
from envhub.trainer.kl_reward import charge_kl
from envhub.trainer.memory import release_freed_memory
from envhub.trainer.producer import GroupProducer
from envhub.trainer.scoring import Scored, estimate_advantages, score
from envhub.trainer.tasks import TaskSchedule
from envhub.trainer.trainer_logprobs import TrainerLogprobs
from envhub.types import Trajectory

if TYPE_CHECKING:
    from envhub.trainer.distill.phase import Distiller
    from envhub.trainer.sft.demonstrations import Demonstration, Demonstrations

TRAIN_PHASES = ("logprobs", "update", "values", "critic")
"""The phases that run the trainer's models (``throughput/train_tokens_per_s``)."""


@dataclass
class Run:
    """The live parts every step of a run uses (the loop builds and closes them); also what
    its checkpoints hold (``checkpoint.run_state.RunParts``)."""

    config: TrainConfig
    backend: TrainBackend
    engine: RolloutEngine
    producer: GroupProducer
    kl_controller: KLController | None = None
    """The KL-in-reward coefficient's controller (``algorithm.kl_in_reward``)."""
    critic: Critic | None = None
    """The value model of a critic estimator (``algorithm.advantage: gae``)."""
    on_phase: Callable[[str], None] | None = None
    """Told the name of each phase a step enters (``Reporter.phase``: the CLI's heartbeat)."""
    cores: CoreSplit | None = None
    """How the engine and the trainer share the CPU cores (torch's threads per update)."""
    demonstrations: Demonstrations | None = None
    """The ``sft:`` demonstrations: the warm start's batches, and RL's auxiliary term."""
    distiller: Distiller | None = None
    """The ``distill:`` teacher and what it is shown."""

    @property
    def schedule(self) -> TaskSchedule:
        """The task schedule the producer draws from."""
        return self.producer.schedule


@dataclass
class PhaseTimer:
    """Wall time per phase of a step (``time/<phase>`` metrics)."""

    seconds: dict[str, float] = field(default_factory=dict)
    on_enter: Callable[[str], None] | None = None
    """Told each phase's name as it is entered."""

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        """Time the ``with`` block and add its wall time to ``phase`` (a phase may be entered
        several times in a step)."""
        if self.on_enter is not None:
            self.on_enter(phase)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        """Seconds per phase as ``time/<phase>``, and their sum as ``time/step``."""
        return {f"time/{k}": v for k, v in self.seconds.items()} | {
            "time/step": sum(self.seconds.values())
        }


async def train_step(step: int, run: Run) -> tuple[dict[str, float], NoSignal | None]:
    """One step: take scored groups, build the batch, update the policy, sync the engine.
    Returns the step's metrics and, when it had nothing to learn from, why.

    With KL in the reward (``run.kl_controller``), the step's sequences are scored under the
    policy and the reference model between the rewards and the advantages (see
    ``kl_reward``). With a critic, it values the sequences before the advantages and learns
    GAE's returns after the policy's update; during ``critic.warmup_steps`` only it learns.
    """
    timer = PhaseTimer(on_enter=run.on_phase)
    with timer("rollout"):  # at max_staleness >= 1: the wait for groups that are not ready
        taken = await run.producer.take(step)
    engine_metrics = {f"engine/{k}": v for k, v in run.producer.engine_stats().items()}
    sampled = _record(step, run.config, taken)
    await run.engine.check_alive()  # a dead engine fails every episode: stop, don't train on it
    with timer("prepare"):
        scored = score(taken.trajectories, run.config.algorithm, run.config.rollout.max_tokens)
    await run.engine.sleep()
    scored, kl_metrics = await _charge_kl(run, scored, timer)
    batch = await _advantages_and_batch(run, scored, timer)
    batch, distill_metrics = await _distill(step, run, batch, scored, timer)
    batch = with_demonstrations(step, run, batch)
    update_metrics = await _update(step, run, batch, timer)
    with timer("sync"):
        sync_metrics = await run.engine.update_weights(run.backend, version=step + 1) or {}
    metrics = (
        rollout_metrics(sampled, run.producer.schedule)
        | engine_metrics
        | batch.stats
        | kl_metrics
        | distill_metrics
        | update_metrics
        | sync_metrics
        | taken.metrics
        | timer.metrics()
        | _throughput(sampled, batch, timer)
    )
    return metrics, no_signal(scored, batch, run.producer.schedule.pass_threshold)


def with_demonstrations(step: int, run: Run, batch: Batch) -> Batch:
    """``batch`` with ``sft.aux_batch_size`` demonstrations weighted ``sft.aux_weight`` (the
    supervised term during RL), the stream going on where the warm start's steps left it;
    ``batch`` itself when the run has no such term."""
    sft, demos = run.config.sft, run.demonstrations
    if sft is None or not sft.aux_weight or demos is None:
        return batch
    size = sft.aux_batch_size or sft.batch_size
    chosen = demos.batch(
        step - run.config.sft_steps, size, start=run.config.sft_steps * sft.batch_size
    )
    samples = demonstration_samples(chosen, sft.aux_weight)
    stats = batch.stats | {"batch/demonstrations": float(len(samples))}
    return Batch(batch.samples + samples, stats)


def demonstration_samples(demos: Sequence[Demonstration], weight: float) -> list[Sample]:
    """Demonstrations as samples of the supervised term (``weight`` per token; no trajectory
    of the step: index -1)."""
    return [
        Sample(list(d.token_ids), list(d.loss_mask), [0.0] * len(d.token_ids), 0.0, -1,
               supervised=weight)
        for d in demos
    ]  # fmt: skip


def _record(step: int, config: TrainConfig, taken: Taken) -> list[Trajectory]:
    """Every episode the step sampled (groups that refills replaced too), saved with the run's
    manifest of envs and samplers."""
    sampled = taken.trajectories + taken.set_aside
    if config.logging.save_trajectories:
        save_trajectories(config.run_dir / "trajectories" / f"step-{step + 1:06d}.jsonl", sampled)
    update_manifest(config.run_dir / "manifest.json", sampled)
    return sampled


async def _charge_kl(run: Run, scored: Scored, timer: PhaseTimer) -> tuple[Scored, dict]:
    """With KL in the reward: the penalty on ``scored``, which needs logprobs before the
    advantages (``kl_reward``)."""
    if run.kl_controller is None:
        return scored, {}
    with timer("logprobs"):
        estimator = run.config.algorithm.kl_in_reward.estimator  # type: ignore[union-attr]
        return await asyncio.to_thread(charge_kl, scored, run.backend, run.kl_controller, estimator)


async def _distill(
    step: int, run: Run, batch: Batch, scored: Scored, timer: PhaseTimer
) -> tuple[Batch, dict[str, float]]:
    """With a teacher: the batch's advantages mixed with its per-token signal."""
    if run.distiller is None or not batch.samples:
        return batch, {}
    with timer("teacher"):
        return await run.distiller(step, batch, list(scored.trajectories))


async def _advantages_and_batch(run: Run, scored: Scored, timer: PhaseTimer) -> Batch:
    """The critic's values (when there is one), the advantages, and what the update trains on
    (dynamic sampling, the overlong filter)."""
    values = None
    if run.critic is not None and scored.usable:
        with timer("values"):
            sequences = [scored.trajectories[i].token_ids or [] for i in scored.usable]
            values = await asyncio.to_thread(run.critic.values, sequences)
    with timer("prepare"):
        advantages = estimate_advantages(scored, run.config.algorithm, values)
        return select(scored, advantages, run.config.algorithm)


async def _update(step: int, run: Run, batch: Batch, timer: PhaseTimer) -> dict[str, float]:
    """The policy's update (not while the critic warms up), then the critic's."""
    config, metrics = run.config, {}
    warming_up = run.critic is not None and step < config.sft_steps + config.critic.warmup_steps
    if batch.samples and not warming_up:
        metrics = await run_update(step, run, batch, timer)
    if run.critic is not None and batch.samples:
        with timer("critic"):
            updates = config.algorithm.updates_per_step
            metrics |= await asyncio.to_thread(update_critic, run.critic, batch, updates)
            metrics["critic/warmup"] = float(warming_up)
        release_freed_memory()
    return metrics


async def run_update(
    step: int,
    run: Run,
    batch: Batch,
    timer: PhaseTimer,
    spec: ObjectiveSpec | None = None,
    updates: int | None = None,
) -> dict[str, float]:
    """:func:`update_policy` in a worker thread, torch's threads balanced against the engine's
    work; the trainer's logprobs of the step's trajectories saved. Returns the metrics."""
    config = run.config
    balancer = ThreadBalancer(run.cores or CoreSplit(()), _engine_working(run))
    metrics, seen = await asyncio.to_thread(
        balancer.run, update_policy, batch, config, run.backend, timer, spec, updates
    )
    metrics |= balancer.metrics()
    release_freed_memory()  # the thread's heap would keep it (see trainer/memory.py)
    if config.logging.save_trajectories and seen:
        path = trainer_logprobs.trainer_logprobs_path(config.run_dir, step + 1)
        trainer_logprobs.save(path, seen)
    return metrics


def _engine_working(run: Run) -> Callable[[], bool]:
    """Whether the engine's cores are busy now: it works on a request of this process (not
    while its episodes wait on tools), or, when rollout workers send the requests, any
    episode is rolling out."""
    engine = run.engine
    if run.producer.workers is None and hasattr(engine, "generating"):
        return lambda: engine.generating > 0
    return lambda: run.producer.busy


def _throughput(sampled: list[Trajectory], batch: Batch, timer: PhaseTimer) -> dict[str, float]:
    """Sampled tokens per second of the rollout's wait and trained tokens per second of the
    phases that ran the trainer's models."""
    completion_tokens = sum(t.num_completion_tokens for t in sampled)
    metrics = {
        "throughput/rollout_tokens_per_s": completion_tokens / max(timer.seconds["rollout"], 1e-9)
    }
    train_seconds = sum(timer.seconds.get(p, 0.0) for p in TRAIN_PHASES)
    if train_seconds:
        metrics["throughput/train_tokens_per_s"] = (
            sum(len(s) for s in batch.samples) / train_seconds
        )
    return metrics


def update_policy(
    batch: Batch,
    config: TrainConfig,
    backend: TrainBackend,
    timer: PhaseTimer,
    spec: ObjectiveSpec | None = None,
    updates: int | None = None,
) -> tuple[dict[str, float], TrainerLogprobs]:
    """Optimizer update(s) on the batch: ``algorithm.updates_per_step`` mini-batches (or
    ``updates``), each cut into micro-batches by the backend, with the run's objective (or
    ``spec``).

    Returns the metrics and the trainer's logprob of each trained token: the policy's before
    any of the step's updates (the ``old`` logprobs) when there are several, else the ones the
    one update's loss saw (the same policy); empty when the backend returns none.
    """
    spec = spec or objective_spec(config)
    updates = min(updates or config.algorithm.updates_per_step, len(batch.samples))
    chunks = [Batch(batch.samples[i::updates]) for i in range(updates)]
    packed = [backend.micro_batches(chunk) for chunk in chunks]
    old = ref = None
    with timer("logprobs"):
        if updates > 1:  # later updates need the logprobs of the policy that sampled
            old = [backend.logprobs(mbs) for mbs in packed]
        if spec.kl_beta > 0:
            ref = [backend.logprobs(mbs, reference=True) for mbs in packed]
    totals: dict[str, float] = {}
    seen: TrainerLogprobs = {}
    with timer("update"):
        for k, (chunk, mbs) in enumerate(zip(chunks, packed, strict=True)):
            result = backend.update(
                mbs,
                spec,
                old_logprobs=old[k] if old else None,
                ref_logprobs=ref[k] if ref else None,
                num_tokens=chunk.num_tokens,
                num_sequences=chunk.num_sequences,
            )
            for name, value in result.metrics.items():
                totals[f"train/{name}"] = totals.get(f"train/{name}", 0.0) + value / updates
            if old or result.token_logprobs:
                seen |= trainer_logprobs.collect(
                    chunk, mbs, old[k] if old else result.token_logprobs
                )
    totals["train/micro_batches"] = float(sum(len(m) for m in packed))
    if totals.get("train/sft_token_frac"):  # the demonstrations' mean negative logprob
        totals["train/sft_nll"] = totals["train/sft_nll_per_token"] / totals["train/sft_token_frac"]
    return totals, seen


def objective_spec(config: TrainConfig) -> ObjectiveSpec:
    """The loss of ``config.algorithm`` as an :class:`ObjectiveSpec` (the length normaliser is
    ``rollout.max_tokens``)."""
    a = config.algorithm
    return ObjectiveSpec(
        policy_loss=a.policy_loss,
        eps_low=a.eps_low,
        eps_high=a.eps_high,
        dual_clip=a.dual_clip,
        aggregation=a.aggregation,
        norm_length=config.rollout.max_tokens,
        kl_beta=a.kl_beta,
        kl_estimator=a.kl_estimator,
        entropy_coef=a.entropy_coef,
        mismatch=a.mismatch,
        mismatch_cap=a.mismatch_cap,
        mismatch_low=a.mismatch_low,
        mismatch_high=a.mismatch_high,
    )


def rollout_metrics(trajectories: list[Trajectory], schedule: TaskSchedule) -> dict[str, float]:
    """Reward (mean, std, per component), pass@1, tool use, lengths and failures of the step."""
    s = summarize(trajectories, pass_threshold=schedule.pass_threshold)
    metrics = {
        "reward/mean": s.reward_mean,
        "reward/std": s.reward_std,
        "pass@1": s.pass_at.get(1, 0.0),
    }
    metrics |= {f"reward/{name}": value for name, value in s.components.items()}
    metrics |= {
        "rollout/episodes": float(s.episodes),
        "rollout/completion_tokens": s.completion_tokens_mean,
        "rollout/turns": s.turns_mean,
        "rollout/tool_calls": s.tool_calls,
        "rollout/errors": float(s.episodes_with_errors),
        "rollout/token_drift": float(s.token_drift_episodes),
        "rollout/truncated": float(sum(t.truncated for t in trajectories))
        / max(len(trajectories), 1),
    }
    if s.tool_validity is not None:  # pooled over the step's calls; not the per-episode
        metrics["rollout/valid_tool_calls"] = s.tool_validity  # reward/tool_validity
    return metrics | role_metrics(trajectories)


def role_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """Per role of a multi-role env (solver seats together): ``reward/<role>`` (mean reward)
    and ``rollout/episodes/<role>``; nothing for one-role episodes."""
    by_role: dict[str, list[float]] = {}
    for t in trajectories:
        if t.role_name is not None:
            by_role.setdefault(t.role_name, []).append(t.reward)
    metrics = {}
    for role, rewards in sorted(by_role.items()):
        metrics[f"reward/{role}"] = sum(rewards) / len(rewards)
        metrics[f"rollout/episodes/{role}"] = float(len(rewards))
    return metrics


def save_trajectories(path: Path, trajectories: list[Trajectory]) -> None:
    """Write a step's trajectories to ``path`` as JSON lines, replacing any earlier file."""
    path.unlink(missing_ok=True)  # a resumed run rewrites the steps it repeats
    with TrajectoryWriter(path) as writer:
        for t in trajectories:
            writer.write(t)
