"""The training loop, top to bottom.

    tasks -> rollouts (engine + envs) -> rewards -> advantages -> filter -> pack
          -> train step -> weight sync -> log / checkpoint

Departures from the GRPO paper, all configurable: the default clip range is asymmetric (DAPO's
0.2 / 0.28), the KL penalty is off (beta 0, no reference model loaded), groups whose rewards are
all equal are dropped (dynamic sampling, without re-sampling to refill the batch), and the loss
is corrected for the gap between the sampler's and the trainer's logprobs (truncated importance
sampling). With one update per step the policy that sampled is the policy being trained, so the
"old" logprobs are the current ones detached and no extra forward pass is spent on them.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from envhub.errors import ConfigError, EngineError, WorkerError, WorkerGroupClosedError
from envhub.evaluation import summarize
from envhub.rollout.io import TrajectoryWriter
from envhub.rollout.manifest import update_manifest
from envhub.rollout.tool_prompt import where_tools_go
from envhub.trainer import trainer_logprobs
from envhub.trainer.algorithms import KLController, ObjectiveSpec, make_kl_controller
from envhub.trainer.backends import TrainBackend, make_backend
from envhub.trainer.batch import Batch, NoSignal, no_signal, select
from envhub.trainer.checkpoint import CheckpointManager
from envhub.trainer.cluster.run import start_ray, stop_ray
from envhub.trainer.config import TrainConfig
from envhub.trainer.critic import Critic, describe_critic, make_critic, update_critic
from envhub.trainer.engines.base import RolloutEngine
from envhub.trainer.held_out import HeldOutEval
from envhub.trainer.kl_reward import charge_kl
from envhub.trainer.memory import release_freed_memory
from envhub.trainer.models import resolve_model
from envhub.trainer.no_signal import EmptySteps
from envhub.trainer.producer import GroupProducer
from envhub.trainer.rollout_workers import RolloutWorkers
from envhub.trainer.scoring import estimate_advantages, score
from envhub.trainer.tasks import TaskSchedule
from envhub.trainer.tracking import MetricsLogger, plot_rewards, read_metrics
from envhub.trainer.trainer_logprobs import TrainerLogprobs
from envhub.types import Trajectory


class Reporter(Protocol):
    """Receives progress; the CLI renders it with rich, tests record it."""

    def start(self, config: TrainConfig, info: dict[str, Any]) -> None:
        """The run is ready to take its first step: the engine has started and been synced.

        Args:
            config: The run's validated configuration.
            info: The run's header: ``run_dir``, ``resumed_from``, ``parameters``, ``device``,
                ``engine``, what the initial weight sync reported and, with rollout workers,
                ``rollout_workers``.
        """
        ...

    def rollout_progress(self, done: int, total: int) -> None:
        """``done`` of this step's ``total`` episodes have finished."""
        ...

    def step(self, step: int, metrics: dict[str, float]) -> None:
        """Step ``step`` (counted from 1) finished with these metrics; step 0 is the held-out
        evaluation before the first step (``eval/*`` metrics only)."""
        ...

    def finish(self, result: RunResult) -> None:
        """The run finished and released its engine and backend; ``result`` says what it left."""
        ...


class SilentReporter:
    """A :class:`Reporter` that ignores everything (the default of :func:`train`)."""

    def start(self, config: TrainConfig, info: dict[str, Any]) -> None:
        """Ignore the run's start."""

    def rollout_progress(self, done: int, total: int) -> None:
        """Ignore rollout progress."""

    def step(self, step: int, metrics: dict[str, float]) -> None:
        """Ignore the step's metrics."""

    def finish(self, result: RunResult) -> None:
        """Ignore the run's result."""


@dataclass
class RunResult:
    """What a finished run leaves behind."""

    run_dir: Path
    history: list[dict[str, Any]]
    """One row of metrics per step (also in ``metrics.jsonl``)."""
    final_model: Path | None = None
    plot: Path | None = None
    resumed_from: int | None = None


@dataclass
class PhaseTimer:
    """Wall time per phase of a step (``time/<phase>`` metrics)."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        """Time the ``with`` block and add its wall time to ``phase`` (a phase may be entered
        several times in a step)."""
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


STEP_LOST = (EngineError, WorkerError, WorkerGroupClosedError)
"""Failures that lose the step (a dead engine or trainer rank): the run stops and says how to
resume from the last checkpoint."""


def train(config: TrainConfig, reporter: Reporter | None = None) -> RunResult:
    """Run (or resume) the training run described by ``config``."""
    return asyncio.run(_train(config, reporter or SilentReporter()))


async def _train(config: TrainConfig, reporter: Reporter) -> RunResult:
    # Cheap checks first: a bad env name or argument, or a model that is not there, fails here
    # in a second, before Ray, the model load or an engine start.
    schedule = TaskSchedule.from_specs(config.envs, config.seed)
    held_out = HeldOutEval(config) if config.eval is not None else None
    resolve_model(config.model.name)
    run_dir = config.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(config.model_dump_json(indent=2))
    seed_everything(config.seed)
    started_ray = start_ray(config)
    try:
        backend = make_backend(config)
        try:
            start = await _run_steps(config, schedule, backend, reporter, held_out)
            result = _finish(config, backend, start)
        finally:
            backend.close()
    finally:
        stop_ray(started_ray)
    reporter.finish(result)
    return result


async def _run_steps(
    config: TrainConfig,
    schedule: TaskSchedule,
    backend: TrainBackend,
    reporter: Reporter,
    held_out: HeldOutEval | None,
) -> int:
    """Resume, then run the remaining steps with checkpoints; returns the step resumed from."""
    run_dir = config.run_dir
    engine = make_engine(config, backend)
    producer = GroupProducer(config, schedule, engine, on_progress=reporter.rollout_progress)
    checkpoints = CheckpointManager(run_dir / "checkpoints", keep_last=config.checkpoint.keep_last)
    kl_control = kl_controller(config)
    critic = make_critic(config, backend)
    start = resume(config, checkpoints, backend, producer, engine, kl_control, critic)
    _forget_steps_after(run_dir / "metrics.jsonl", start)
    tracker = MetricsLogger(config, run_dir)
    empty_steps = EmptySteps(config.algorithm.max_empty_steps)
    try:
        await _start_rollouts(config, backend, engine, producer, reporter, start, held_out)
        if held_out is not None and start == 0 and held_out.due(0):
            baseline = await held_out.run(0, engine, isolated=True)  # nothing rolls out yet
            tracker.log(0, baseline)
            reporter.step(0, baseline)
        producer.start(first_draw=start)
        for step in range(start, config.steps):
            try:
                metrics, empty = await train_step(
                    step, config, producer, engine, backend, kl_control, critic
                )
                if held_out is not None and held_out.due(step + 1):
                    metrics |= await held_out.run(step + 1, engine, isolated=not producer.busy)
            except STEP_LOST as e:
                raise _stopped(e, step, checkpoints.latest()) from e
            except asyncio.CancelledError:  # Ctrl-C or SIGTERM
                if producer.waiting:  # between updates: keep the groups rolled out so far
                    save_checkpoint(
                        step, checkpoints, backend, producer, engine, kl_control, critic
                    )
                raise
            tracker.log(step + 1, metrics)
            reporter.step(step + 1, metrics)
            if (step + 1) % config.checkpoint.every == 0 or step + 1 == config.steps:
                save_checkpoint(
                    step + 1, checkpoints, backend, producer, engine, kl_control, critic
                )
            empty_steps.observe(step + 1, empty)  # may stop the run, after the checkpoint
    finally:
        tracker.close()
        if critic is not None:
            critic.close()
        await producer.aclose()
        if producer.workers is not None:
            await producer.workers.aclose()
        await engine.aclose()
    return start


async def _start_rollouts(
    config: TrainConfig,
    backend: TrainBackend,
    engine: RolloutEngine,
    producer: GroupProducer,
    reporter: Reporter,
    start: int,
    held_out: HeldOutEval | None,
) -> None:
    """Start the engine with the trainer's weights and the rollout workers if any; tell the
    reporter what runs where."""
    # The engine starts from the model on disk: give it the trainer's weights (a resumed
    # run's, and a check that both sides compute the same logprobs) before any rollout.
    await engine.start()
    initial_sync = await engine.update_weights(backend, version=start) or {}
    info = {
        "run_dir": str(config.run_dir),
        "resumed_from": start or None,
        "parameters": backend.num_parameters(),
        "device": backend.describe(),
        "engine": repr(engine),
    } | initial_sync
    num_tools = max(slot.num_tools for slot in producer.schedule.slots)
    if num_tools and engine.tokenizer is not None:  # where the model finds them
        info["tools"] = await where_tools_go(engine.tokenizer, num_tools)
    if config.rollout.workers:
        producer.workers = RolloutWorkers.for_run(config, engine)
        info["rollout_workers"] = producer.workers.info
    if held_out is not None:
        info["eval"] = held_out.describe()
    if config.algorithm.needs_critic:
        info["critic"] = describe_critic(config)
    reporter.start(config, info)


async def train_step(
    step: int,
    config: TrainConfig,
    producer: GroupProducer,
    engine: RolloutEngine,
    backend: TrainBackend,
    kl_control: KLController | None = None,
    critic: Critic | None = None,
) -> tuple[dict[str, float], NoSignal | None]:
    """One step: take scored groups, build the batch, update the policy, sync the engine.
    Returns the step's metrics and, when it had nothing to learn from, why.

    With KL in the reward (``kl_control``), the step's sequences are scored under the policy
    and the reference model between the rewards and the advantages (see ``kl_reward``). With a
    critic (``advantage: gae``), it values the sequences before the advantages and learns
    GAE's returns after the policy's update; during ``critic.warmup_steps`` only it learns.

    The update runs in a worker thread, so that the producer's rollouts (with
    ``rollout.max_staleness >= 1``) go on meanwhile; at 0 nothing is rolling out then.
    """
    timer = PhaseTimer()
    with timer("rollout"):  # at max_staleness >= 1: the wait for groups that are not ready
        taken = await producer.take(step)
    trajectories = taken.trajectories
    sampled = trajectories + taken.set_aside  # groups that refills replaced count as sampled
    stats = producer.workers.stats() if producer.workers else engine.stats()
    engine.reset_stats()
    engine_metrics = {f"engine/{k}": v for k, v in stats.items()}
    if config.logging.save_trajectories:
        save_trajectories(config.run_dir / "trajectories" / f"step-{step + 1:06d}.jsonl", sampled)
    update_manifest(config.run_dir / "manifest.json", sampled)  # which envs and samplers
    await engine.check_alive()  # a dead engine fails every episode: stop, don't train on it
    with timer("prepare"):
        scored = score(trajectories, config.algorithm, config.rollout.max_tokens)  # rewards
    await engine.sleep()
    kl_metrics: dict[str, float] = {}
    if kl_control is not None:  # the KL penalty needs logprobs before the advantages
        with timer("logprobs"):
            estimator = config.algorithm.kl_in_reward.estimator  # type: ignore[union-attr]
            scored, kl_metrics = await asyncio.to_thread(
                charge_kl, scored, backend, kl_control, estimator
            )
    values = None
    if critic is not None and scored.usable:
        with timer("values"):
            sequences = [scored.trajectories[i].token_ids or [] for i in scored.usable]
            values = await asyncio.to_thread(critic.values, sequences)
    with timer("prepare"):
        advantages = estimate_advantages(scored, config.algorithm, values)
        batch = select(scored, advantages, config.algorithm)  # dynamic sampling, overlong filter
    update_metrics = {}
    warming_up = critic is not None and step < config.critic.warmup_steps
    if batch.samples and not warming_up:
        update_metrics, seen = await asyncio.to_thread(update_policy, batch, config, backend, timer)
        release_freed_memory()  # the thread's heap would keep it (see trainer/memory.py)
        if config.logging.save_trajectories and seen:
            trainer_logprobs.save(
                trainer_logprobs.trainer_logprobs_path(config.run_dir, step + 1), seen
            )
    if critic is not None and batch.samples:
        with timer("critic"):
            updates = config.algorithm.updates_per_step
            update_metrics |= await asyncio.to_thread(update_critic, critic, batch, updates)
            update_metrics["critic/warmup"] = float(warming_up)
        release_freed_memory()
    with timer("sync"):
        sync_metrics = await engine.update_weights(backend, version=step + 1) or {}
    metrics = (
        rollout_metrics(sampled, producer.schedule)
        | engine_metrics
        | batch.stats
        | kl_metrics
        | update_metrics
        | sync_metrics
        | taken.metrics
        | timer.metrics()
    )
    completion_tokens = sum(t.num_completion_tokens for t in sampled)
    metrics["throughput/rollout_tokens_per_s"] = completion_tokens / max(
        timer.seconds["rollout"], 1e-9
    )
    train_seconds = sum(
        timer.seconds.get(p, 0.0) for p in ("logprobs", "update", "values", "critic")
    )
    if train_seconds:
        metrics["throughput/train_tokens_per_s"] = (
            sum(len(s) for s in batch.samples) / train_seconds
        )
    return metrics, no_signal(scored, batch, producer.schedule.pass_threshold)


def update_policy(
    batch: Batch, config: TrainConfig, backend: TrainBackend, timer: PhaseTimer
) -> tuple[dict[str, float], TrainerLogprobs]:
    """Optimizer update(s) on the batch: ``algorithm.updates_per_step`` mini-batches, each cut
    into micro-batches by the backend.

    Returns the metrics and the trainer's logprob of each trained token: the policy's before
    any of the step's updates (the ``old`` logprobs) when there are several, else the ones the
    one update's loss saw (the same policy); empty when the backend returns none.
    """
    spec = objective_spec(config)
    updates = min(config.algorithm.updates_per_step, len(batch.samples))
    chunks = [Batch(batch.samples[i::updates]) for i in range(updates)]
    packed = [backend.micro_batches(chunk) for chunk in chunks]
    old = ref = None
    with timer("logprobs"):
        if updates > 1:  # later updates need the logprobs of the policy that sampled
            old = [backend.logprobs(mbs) for mbs in packed]
        if config.algorithm.kl_beta > 0:
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
    if s.tool_validity is not None:
        metrics["rollout/tool_validity"] = s.tool_validity
    return metrics


# -- engine, checkpoints, resume ----------------------------------------------------------------


def make_engine(config: TrainConfig, backend: TrainBackend) -> RolloutEngine:
    """The rollout engine: ``hf`` generates with the policy module itself (nothing to sync);
    ``vllm`` runs vLLM and receives the weights after every step."""
    if config.rollout.engine == "hf":
        from envhub.trainer.engines.hf import HFEngine

        return HFEngine(
            backend.model,
            backend.tokenizer,
            max_batch_size=config.rollout.max_concurrency,
            seed=config.seed,
        )
    if config.rollout.engine == "vllm":
        from envhub.trainer.engines.vllm import make_vllm_engine  # imports vLLM only when it starts

        return make_vllm_engine(config, backend)
    raise ConfigError(f"unknown rollout engine {config.rollout.engine!r}; available: hf, vllm")


def _stopped(error: Exception, step: int, checkpoint: Path | None) -> Exception:
    """``error`` with where the run stopped and how to go on (same class, so callers can tell)."""
    how = (
        f"rerun the same command to resume from {checkpoint}"
        if checkpoint
        else "no checkpoint was saved yet; rerunning starts over"
    )
    stopped = type(error).__new__(type(error))  # not __init__: its signature is the class's own
    stopped.args = (f"{error}\nTraining stopped in step {step + 1}: {how}.",)
    # Keeps attributes such as a dead worker's index and node.
    stopped.__dict__.update(error.__dict__)
    return stopped


def kl_controller(config: TrainConfig) -> KLController | None:
    """The controller of ``algorithm.kl_in_reward``'s coefficient; ``None`` when it is off."""
    spec = config.algorithm.kl_in_reward
    if spec is None:
        return None
    return make_kl_controller(spec.type, spec.coef, spec.target_kl, spec.horizon)


def save_checkpoint(
    step: int,
    checkpoints: CheckpointManager,
    backend: TrainBackend,
    producer: GroupProducer,
    engine: RolloutEngine,
    kl_control: KLController | None = None,
    critic: Critic | None = None,
) -> Path:
    """Save a checkpoint after ``step`` completed steps and return its folder.

    It holds the backend's model, optimizer and scheduler, the critic's (``critic/``) when
    there is one, and the loop's own state: the step, the task schedule's cursors, the
    producer's buffer and the tasks it had in flight (a resumed run trains on the former and
    samples the latter again: no task is skipped) and the engine's state, and the KL-in-reward
    controller's coefficient, which :func:`resume` restores.
    """
    trainer_state = {
        "step": step,
        "schedule": producer.schedule.state_dict(),
        "producer": producer.state_dict(),
        "engine": engine.state_dict(),
    }
    if kl_control is not None:
        trainer_state["kl_controller"] = kl_control.state_dict()
    return checkpoints.save(
        step,
        **backend.state(),
        trainer_state=trainer_state,
        critic=critic.state() if critic is not None else None,
    )


def resume(
    config: TrainConfig,
    checkpoints: CheckpointManager,
    backend: TrainBackend,
    producer: GroupProducer,
    engine: RolloutEngine,
    kl_control: KLController | None = None,
    critic: Critic | None = None,
) -> int:
    """Load the checkpoint to continue from, if any; returns the first step to run."""
    choice = config.checkpoint.resume
    if choice == "never":
        return 0
    path = checkpoints.latest() if choice == "auto" else Path(choice)
    if path is None:
        return 0
    state = backend.state()
    trainer_state = checkpoints.load(
        path,
        model=state["model"],
        optimizer=state["optimizer"],
        scheduler=state["scheduler"],
        critic=critic.state() if critic is not None else None,
    )
    producer.schedule.load_state_dict(trainer_state["schedule"])
    if trainer_state.get("producer") is not None:
        producer.load_state_dict(trainer_state["producer"])
    if trainer_state.get("engine") is not None:
        engine.load_state_dict(trainer_state["engine"])
    if kl_control is not None and trainer_state.get("kl_controller") is not None:
        kl_control.load_state_dict(trainer_state["kl_controller"])
    return int(trainer_state["step"])


def _finish(config: TrainConfig, backend: TrainBackend, start: int) -> RunResult:
    run_dir = config.run_dir
    metrics_path = run_dir / "metrics.jsonl"
    history = read_metrics(metrics_path) if metrics_path.exists() else []
    final = backend.export(run_dir / "final") if config.checkpoint.export_hf else None
    plot = (
        plot_rewards(history, run_dir / "reward.png", config.run_name)
        if config.logging.plot and history
        else None
    )
    return RunResult(
        run_dir=run_dir, history=history, final_model=final, plot=plot, resumed_from=start or None
    )


def save_trajectories(path: Path, trajectories: list[Trajectory]) -> None:
    """Write a step's trajectories to ``path`` as JSON lines, replacing any earlier file."""
    path.unlink(missing_ok=True)  # a resumed run rewrites the steps it repeats
    with TrajectoryWriter(path) as writer:
        for t in trajectories:
            writer.write(t)


def _forget_steps_after(path: Path, start: int) -> None:
    """A resumed run repeats the steps after its checkpoint: drop their old metric rows."""
    if not path.exists():
        return
    rows = [
        line
        for line in path.read_text().splitlines()
        if line.strip() and json.loads(line)["step"] <= start
    ]
    path.write_text("".join(row + "\n" for row in rows))


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global random generators with ``seed``."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
