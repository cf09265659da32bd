"""What a run writes and measures besides its updates: metrics and trajectories
(``logging:``), checkpoints (``checkpoint:``) and held-out evaluation (``eval:``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from envhub.trainer.config_base import ConfigPart as _Part
from envhub.trainer.config_base import EnvName


class LoggingConfig(_Part):
    """Where metrics and trajectories go."""

    output_dir: Path = Path("outputs/train")
    """Runs are written to ``output_dir/run_name``."""
    run_name: str | None = None
    """Default: ``<first env>-<model>``."""
    tensorboard: bool = False
    wandb_project: str | None = None
    trackio_project: str | None = None
    save_trajectories: bool = True
    plot: bool = True
    """Write ``reward.png`` (the reward curve) at the end of the run."""
    heartbeat_seconds: float | None = Field(15.0, gt=0)
    """When output is not a terminal (a log file, CI), print a line this often during a step,
    saying its phase and progress (``step 3/10: rolling out 12/32 episodes, 18 s``); a
    terminal has the live progress bar instead. ``null``: never."""


class CheckpointConfig(_Part):
    """Checkpoints: atomic, resumable, exported as an HF folder at the end."""

    every: int = Field(10, ge=1)
    keep_last: int = Field(2, ge=1)
    resume: Literal["auto", "never"] | Path = "auto"
    """``auto``: continue from the run folder's latest checkpoint if there is one."""
    export_hf: bool = True
    """Write ``final/`` (HF safetensors, servable by vLLM) when the run ends."""


class EvalEnvSpec(_Part):
    """One held-out env (or split) to evaluate on during training."""

    name: EnvName
    """An env name or reference, as in ``envs:``."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for ``envhub.make``: another ``task_seed``, difficulty or split than
    training uses, so that the tasks are held out."""
    label: str | None = None
    """Name in the metrics (``eval/<label>/reward``); default: the env name. Must be unique."""
    num_tasks: int = Field(32, ge=1)
    """Tasks evaluated, spread over the env's dataset (the same ones every time)."""


class EvalConfig(_Part):
    """Held-out evaluation during training (``eval:``; off when absent).

    Before the first step (the baseline), every ``every`` steps and after the last, the policy
    plays each env's held-out tasks through the same rollout runner and engine as training.
    Metrics ``eval/<label>/reward`` and ``eval/<label>/pass@k`` go to ``metrics.jsonl`` (the
    baseline as step 0), the step table and the trackers; the episodes to
    ``trajectories/eval/step-N.jsonl``. It never changes what the run trains on.
    """

    envs: list[EvalEnvSpec] = Field(min_length=1)
    every: int | None = Field(5, ge=1)
    """Steps between evaluations; ``null``: only before the first step and after the last."""
    baseline: bool = True
    """Evaluate before the first step (a resumed run does not evaluate its start again)."""
    samples_per_task: int = Field(1, ge=1)
    """Samples per task: pass@k for k up to this."""
    temperature: float = Field(0.0, ge=0.0)
    """0: greedy."""
    max_tokens: int | None = Field(None, ge=1)
    """Per assistant turn; default: ``rollout.max_tokens``."""

    @model_validator(mode="after")
    def _check(self) -> EvalConfig:
        labels = [e.label or e.name for e in self.envs]
        repeated = sorted({label for label in labels if labels.count(label) > 1})
        if repeated:
            raise ValueError(f"eval.envs: give each a distinct label ({', '.join(repeated)} twice)")
        if self.temperature == 0 and self.samples_per_task > 1:
            raise ValueError(
                "eval.samples_per_task > 1 with greedy decoding gives identical samples: "
                "set eval.temperature > 0 for pass@k"
            )
        return self
