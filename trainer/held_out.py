"""Held-out evaluation during training (``eval:`` in the run config).

Training reward says how the policy does on the batches it trains on; held-out evaluation says
whether it gets better at the task. Before the first step (the baseline, logged as step 0),
every ``eval.every`` steps and after the last, the policy plays each eval env's held-out tasks
(``num_tasks`` spread over its dataset, the same ones every time, seeded the same way) through
the same rollout runner and engine as training: a vLLM engine with the weights just synced, the
HF engine with the live policy.

Evaluation never changes the training run. At ``rollout.max_staleness: 0`` nothing else rolls
out while it runs (the producer launches a draw only when the update asks for it), and the
engine's sampling state (the HF engine's call counter, which seeds every batch) and its
per-step counters are put back afterwards: a run with ``eval`` trains on exactly the tasks and
samples of the same run without (a test compares them). At ``max_staleness >= 1`` evaluation
shares the engine with rollouts in flight, which were not reproducible to begin with.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import envhub
from envhub.checks.checker import spread_tasks
from envhub.errors import ConfigError
from envhub.evaluation import EvalSummary, Evaluation, evaluate
from envhub.inference.base import SamplingParams
from envhub.references import display_name
from envhub.rollout.io import TrajectoryWriter
from envhub.trainer.config import EvalEnvSpec, TrainConfig
from envhub.trainer.engines.base import RolloutEngine
from envhub.types import Trajectory

EVAL_SEED_OFFSET = 7919
"""Added to the run's seed for the eval runners' seed: the same every evaluation, so curves
compare policies, not draws."""


@dataclass(frozen=True)
class EvalTarget:
    """One eval env: its tasks and what counts as a pass."""

    label: str
    spec: EvalEnvSpec
    tasks: list[int]
    pass_threshold: float


def _check_labels(targets: list[EvalTarget]) -> None:
    """Refuse labels that repeat once references name their envs (two files whose envs share a
    name): their metrics would overwrite each other."""
    labels = [t.label for t in targets]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        clashes = "; ".join(
            f"{label!r} from " + ", ".join(t.spec.name for t in targets if t.label == label)
            for label in repeated
        )
        raise ConfigError(
            f"eval.envs: two envs would report under one label ({clashes}); give each a "
            "distinct `label:`"
        )


class HeldOutEval:
    """Runs ``config.eval`` when it is due.

    Args:
        config: The run; ``config.eval`` must be set.

    Raises:
        EnvhubError: An eval env cannot be made (checked here, before any engine starts).
        ConfigError: Two eval envs have the same label once references name their envs.
    """

    def __init__(self, config: TrainConfig) -> None:
        assert config.eval is not None
        self.config, self.settings = config, config.eval
        self.targets = [self._target(spec) for spec in self.settings.envs]
        _check_labels(self.targets)
        self.sampling = SamplingParams(
            temperature=self.settings.temperature,
            max_tokens=self.settings.max_tokens or config.rollout.max_tokens,
            logprobs=False,
        )

    @staticmethod
    def _target(spec: EvalEnvSpec) -> EvalTarget:
        with envhub.make(spec.name, **spec.args) as env:
            size = len(env.dataset) if hasattr(env, "dataset") else spec.num_tasks
            threshold = float(getattr(env, "pass_threshold", 1.0))
        tasks = sorted(set(spread_tasks(min(spec.num_tasks, size), size)))
        return EvalTarget(spec.label or display_name(spec.name), spec, tasks, threshold)

    def due(self, step: int) -> bool:
        """Whether to evaluate after ``step`` completed updates (0: before the first)."""
        if step == 0:
            return self.settings.baseline
        every = self.settings.every
        return step == self.config.total_steps or (every is not None and step % every == 0)

    async def run(self, step: int, engine: RolloutEngine, isolated: bool) -> dict[str, float]:
        """Evaluate the engine's current policy after ``step`` updates: ``eval/*`` metrics and
        ``time/eval``. ``isolated``: nothing else is rolling out, so the engine's sampling
        state is put back afterwards (the run then samples as it would without eval)."""
        snapshot = engine.state_dict() if isolated else None
        started = time.perf_counter()
        metrics: dict[str, float] = {}
        episodes: list[Trajectory] = []
        for index, target in enumerate(self.targets):
            result = await self._play(target, index, engine)
            episodes += result.trajectories
            metrics |= _target_metrics(target, result.summary)
        rewards = [metrics[f"eval/{t.label}/reward"] for t in self.targets]
        metrics["eval/reward"] = sum(rewards) / len(rewards)
        metrics["time/eval"] = time.perf_counter() - started
        if self.config.logging.save_trajectories:
            folder = self.config.run_dir / "trajectories" / "eval"
            _save(folder / f"step-{step:06d}.jsonl", episodes)
        if isolated:
            if snapshot is not None:
                engine.load_state_dict(snapshot)
            engine.reset_stats()
        return metrics

    def describe(self) -> str:
        """One line for the run header: what is evaluated, and when."""
        envs = ", ".join(f"{t.label} ({len(t.tasks)} tasks)" for t in self.targets)
        every = self.settings.every
        when = f"every {every} steps" if every else "after the last step"
        return f"{envs}, {when}" + (", and before the first" if self.settings.baseline else "")

    async def _play(self, target: EvalTarget, index: int, engine: RolloutEngine) -> Evaluation:
        rollout = self.config.rollout
        return await evaluate(
            engine, target.spec.name, target.tasks, env_args=target.spec.args,
            samples_per_task=self.settings.samples_per_task, sampling=self.sampling,
            max_concurrency=rollout.max_concurrency, step_timeout=rollout.step_timeout,
            episode_timeout=rollout.episode_timeout,
            seed=self.config.seed + EVAL_SEED_OFFSET + index,
            pass_threshold=target.pass_threshold,
        )  # fmt: skip


def _target_metrics(target: EvalTarget, summary: EvalSummary) -> dict[str, float]:
    prefix = f"eval/{target.label}"
    metrics = {f"{prefix}/reward": summary.reward_mean}
    metrics |= {f"{prefix}/pass@{k}": v for k, v in summary.pass_at.items()}
    return metrics


def _save(path: Path, trajectories: list[Trajectory]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with TrajectoryWriter(path) as writer:
        for trajectory in trajectories:
            writer.write(trajectory)
