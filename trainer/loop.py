"""The training loop, top to bottom.

    tasks -> rollouts (engine + envs) -> rewards -> advantages -> filter -> pack
          -> train step -> weight sync -> log / checkpoint

Departures from the GRPO paper, all configurable: the default clip range is asymmetric (DAPO's
0.2 / 0.28), the KL penalty is off (beta 0, no reference model loaded), groups whose rewards are
all equal are dropped (dynamic sampling, without re-sampling to refill the batch), and the loss
is corrected for the gap between the sampler's and the trainer's logprobs (truncated importance
sampling). With one update per step the policy that sampled is the policy being trained, so the
"old" logprobs are the current ones detached and no extra forward pass is spent on them.

This module runs the steps; ``step.py`` is one step, phase by phase; ``producer.py`` rolls out
the groups ahead of the update; ``checkpoint/run_state.py`` decides what a checkpoint holds.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from envhub.errors import EngineError, WorkerError, WorkerGroupClosedError
from envhub.lifetime import owning
from envhub.rollout.tool_prompt import where_tools_go
from envhub.trainer.backends import TrainBackend, make_backend
from envhub.trainer.batch import NoSignal
from envhub.trainer.checkpoint import CheckpointManager
from envhub.trainer.checkpoint.run_state import RunCheckpoints
from envhub.trainer.cluster.run import start_ray, stop_ray
from envhub.trainer.config import TrainConfig
from envhub.trainer.cores import (
    BIND_ENV,
    PhaseTimes,
    async_advice,
    choose_split,
    limit_interop_threads,
    phases_of_run,
)
from envhub.trainer.critic import describe_critic, make_critic
from envhub.trainer.distill.phase import make_distiller
from envhub.trainer.engines import make_engine
from envhub.trainer.held_out import HeldOutEval
from envhub.trainer.kl_reward import kl_controller
from envhub.trainer.models import resolve_model
from envhub.trainer.no_signal import EmptySteps
from envhub.trainer.producer import GroupProducer
from envhub.trainer.role_balance import check_role_scale
from envhub.trainer.sft.demonstrations import Demonstrations, load_for_run, with_sft_steps
from envhub.trainer.sft.step import sft_step
from envhub.trainer.step import Run, train_step
from envhub.trainer.tasks import TaskSchedule
from envhub.trainer.tracking import MetricsLogger, plot_rewards, read_metrics


class Reporter(Protocol):
    """Receives progress; the CLI renders it with rich, tests record it."""

    def start(self, config: TrainConfig, info: dict[str, Any]) -> None:
        """The run is ready to take its first step: the engine has started and been synced.

        Args:
            config: The run's validated configuration.
            info: The run's header: ``run_dir``, ``resumed_from``, ``parameters``, ``device``,
                ``engine``, what the initial weight sync reported and, with rollout workers,
                ``rollout_workers``; ``cores`` where the run split the CPU cores between the
                engine and the trainer, ``advice`` where async cannot gain (why, what to set).
        """
        ...

    def rollout_progress(self, done: int, total: int) -> None:
        """``done`` of this step's ``total`` episodes have finished."""
        ...

    def phase(self, name: str) -> None:
        """The run entered phase ``name``: a step's (``rollout``, ``prepare``, ``update``, ...:
        its ``time/<phase>`` metrics), ``eval``, ``checkpoint`` or ``export`` (the final
        model). Optional: the loop skips a reporter without it."""
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

    def phase(self, name: str) -> None:
        """Ignore the phase."""

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

    @property
    def final_metrics(self) -> dict[str, Any]:
        """The last step's metrics (``{}`` when no step was logged)."""
        return self.history[-1] if self.history else {}


STEP_LOST = (EngineError, WorkerError, WorkerGroupClosedError)
"""Failures that lose the step (a dead engine or trainer rank): the run stops and says how to
resume from the last checkpoint."""


def train(config: TrainConfig, reporter: Reporter | None = None) -> RunResult:
    """Run (or resume) the training run described by ``config``."""
    return asyncio.run(_train(config, reporter or SilentReporter()))


async def _train(config: TrainConfig, reporter: Reporter) -> RunResult:
    # Cheap checks first: a bad env name or argument, or a model that is not there, fails here
    # in a second, before Ray, the model load or an engine start.
    schedule = TaskSchedule.from_specs(config.envs, config.seed, config.curriculum)
    check_role_scale(config.algorithm.role_scale, [r for s in schedule.slots for r in s.roles])
    resolve_model(config.model.name)
    demonstrations = await load_for_run(config)  # a bad source fails here, before the model
    config = with_sft_steps(config, demonstrations)
    held_out = HeldOutEval(config) if config.eval is not None else None
    run_dir = config.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(config.model_dump_json(indent=2))
    seed_everything(config.seed)
    with owning(run_dir):  # first ends what a killed run of this folder left; tags ours
        started_ray = start_ray(config)
        try:
            backend = make_backend(config)
            try:
                start = await _run_steps(
                    config, schedule, backend, reporter, held_out, demonstrations
                )
                if config.checkpoint.export_hf:
                    _enter(getattr(reporter, "phase", None), "export")
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
    demonstrations: Demonstrations | None = None,
) -> int:
    """Resume, then run the remaining steps (the supervised ones first, if any) with
    checkpoints; returns the step resumed from."""
    on_gpu = getattr(backend.device, "type", "cpu") == "cuda"
    # A resumed run's synchronous steps, if any (a run that starts over measured nothing yet).
    phases = phases_of_run(config.run_dir) if config.checkpoint.resume != "never" else None
    cores = choose_split(config, on_gpu=on_gpu, phases=phases)
    limit_interop_threads(cores)
    engine = make_engine(config, backend, cpu_bind=cores.engine_env().get(BIND_ENV))
    producer = GroupProducer(config, schedule, engine, on_progress=reporter.rollout_progress)
    on_phase = getattr(reporter, "phase", None)  # optional: reporters written before it
    run = Run(
        config, backend, engine, producer, kl_controller(config), make_critic(config, backend),
        on_phase=on_phase, cores=cores, demonstrations=demonstrations,
        distiller=make_distiller(config, backend),
    )  # fmt: skip
    checkpoints = RunCheckpoints(
        CheckpointManager(config.run_dir / "checkpoints", keep_last=config.checkpoint.keep_last),
        run,
    )
    start = checkpoints.resume(config.checkpoint.resume)
    _forget_steps_after(config.run_dir / "metrics.jsonl", start)
    tracker = MetricsLogger(config, config.run_dir)
    empty_steps = EmptySteps(config.algorithm.max_empty_steps)
    try:
        await _start_rollouts(run, reporter, start, held_out, phases)
        if held_out is not None and start == 0 and held_out.due(0):
            _enter(run.on_phase, "eval")
            baseline = await held_out.run(0, engine, isolated=True)  # nothing rolls out yet
            tracker.log(0, baseline)
            reporter.step(0, baseline)
        producer.start(first_draw=max(start, config.sft_steps))  # RL draws follow the SFT
        for step in range(start, config.total_steps):
            metrics, empty = await _step(step, run, checkpoints, held_out)
            tracker.log(step + 1, metrics)
            reporter.step(step + 1, metrics)
            if (step + 1) % config.checkpoint.every == 0 or step + 1 == config.total_steps:
                _enter(run.on_phase, "checkpoint")
                checkpoints.save(step + 1)
            empty_steps.observe(step + 1, empty)  # may stop the run, after the checkpoint
    finally:
        tracker.close()
        if run.critic is not None:
            run.critic.close()
        if run.distiller is not None:
            await run.distiller.aclose()
        await producer.aclose()  # and the rollout workers it started
        await engine.aclose()
    return start


async def _step(
    step: int, run: Run, checkpoints: RunCheckpoints, held_out: HeldOutEval | None
) -> tuple[dict[str, float], NoSignal | None]:
    """Step ``step`` and the held-out evaluation due after it. A lost step (a dead engine or
    rank) stops the run saying how to resume; Ctrl-C or SIGTERM between updates first saves
    the groups rolled out so far."""
    try:
        if step < run.config.sft_steps:
            samples_next = step + 1 == run.config.sft_steps or (
                held_out is not None and held_out.due(step + 1)
            )
            metrics, empty = await sft_step(step, run, sync=samples_next), None
        else:
            metrics, empty = await train_step(step, run)
            if empty is not None:  # the run's summary tells a run that never learned
                metrics["train/no_signal"] = 1.0
        if held_out is not None and held_out.due(step + 1):
            _enter(run.on_phase, "eval")
            metrics |= await held_out.run(step + 1, run.engine, isolated=not run.producer.busy)
    except STEP_LOST as e:
        raise _stopped(e, step, checkpoints.latest()) from e
    except asyncio.CancelledError:
        if run.producer.waiting:  # between updates: keep the groups rolled out so far
            checkpoints.save(step)
        raise
    return metrics, empty


def _enter(on_phase: Callable[[str], None] | None, phase: str) -> None:
    """Tell the reporter the run entered ``phase`` (outside a step's own phases)."""
    if on_phase is not None:
        on_phase(phase)


async def _start_rollouts(
    run: Run,
    reporter: Reporter,
    start: int,
    held_out: HeldOutEval | None,
    phases: PhaseTimes | None = None,
) -> None:
    """Start the engine with the trainer's weights and the rollout workers if any; tell the
    reporter what runs where, how the cores are split and, when ``phases`` (measured by
    earlier steps) or the machine say async cannot gain, that too."""
    config, backend, engine = run.config, run.backend, run.engine
    # A teacher whose tokenizer is not the policy's fails here, before the engine starts.
    teacher = await run.distiller.start(backend.tokenizer) if run.distiller is not None else None
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
    slots = run.producer.schedule.slots
    num_tools = max(slot.num_tools for slot in slots)
    from_program = not num_tools and any(slot.tools_from_program for slot in slots)
    if (num_tools or from_program) and engine.tokenizer is not None:  # where the model finds them
        info["tools"] = await where_tools_go(engine.tokenizer, num_tools, from_program)
    if run.cores is not None and run.cores.describe():
        info["cores"] = run.cores.describe()
    advice = async_advice(config, run.cores, phases) if run.cores is not None else None
    if advice:
        info["advice"] = advice
    workers = run.producer.start_workers(run.cores.engine if run.cores is not None else None)
    if workers is not None:
        info["rollout_workers"] = workers
    if held_out is not None:
        info["eval"] = held_out.describe()
    if config.algorithm.needs_critic:
        info["critic"] = describe_critic(config)
    if run.demonstrations is not None:
        info["sft"] = run.demonstrations.describe()
    if teacher is not None:
        info["teacher"] = teacher
    reporter.start(config, info)


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
