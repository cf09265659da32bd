"""Where step metrics go: a JSONL file always; TensorBoard, W&B and trackio when asked.

Each sink is imported only when configured; a missing package is a clear error at start-up,
before any training work.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Protocol

from envhub.errors import MissingDependencyError
from envhub.trainer.config import TrainConfig


class Sink(Protocol):
    """One destination of step metrics."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record the metrics of step ``step``."""
        ...

    def close(self) -> None:
        """Flush and release the destination; called once, at the end of the run."""
        ...


class JsonlSink:
    """``metrics.jsonl``: one object per step, flushed at once (a crash loses nothing logged)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("a", encoding="utf-8")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Append one JSON line with ``step`` and the metrics (NaN and infinities as ``null``,
        which JSON cannot hold) and flush it."""
        clean = {k: (v if math.isfinite(v) else None) for k, v in metrics.items()}
        self._file.write(json.dumps({"step": step, **clean}) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Close the file."""
        self._file.close()


class TensorBoardSink:
    """TensorBoard event files under ``log_dir`` (``logging.tensorboard``), one scalar per
    metric."""

    def __init__(self, log_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise MissingDependencyError(
                "logging.tensorboard needs the tensorboard package: pip install tensorboard"
            ) from e
        self._writer = SummaryWriter(str(log_dir))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Add each metric as a scalar at ``step`` and flush the writer."""
        for name, value in metrics.items():
            self._writer.add_scalar(name, value, step)
        self._writer.flush()

    def close(self) -> None:
        """Close the event writer."""
        self._writer.close()


class ModuleSink:
    """W&B and trackio share one API: ``init(project=, name=, config=)``, ``log(dict, step=)``,
    ``finish()``."""

    def __init__(
        self, module_name: str, project: str, run_name: str, config: dict[str, Any]
    ) -> None:
        import importlib

        try:
            self._module = importlib.import_module(module_name)
        except ImportError as e:
            raise MissingDependencyError(
                f"logging.{module_name}_project needs {module_name}: pip install {module_name}"
            ) from e
        self._module.init(project=project, name=run_name, config=config)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Log the metrics to the module's run at ``step``."""
        self._module.log(metrics, step=step)

    def close(self) -> None:
        """Finish the module's run."""
        self._module.finish()


class MetricsLogger:
    """Fans each step's metrics out to the configured sinks."""

    def __init__(self, config: TrainConfig, run_dir: Path) -> None:
        self.sinks: list[Sink] = [JsonlSink(run_dir / "metrics.jsonl")]
        settings = config.logging
        if settings.tensorboard:
            self.sinks.append(TensorBoardSink(run_dir / "tensorboard"))
        plain = config.model_dump(mode="json")
        if settings.wandb_project:
            self.sinks.append(ModuleSink("wandb", settings.wandb_project, config.run_name, plain))
        if settings.trackio_project:
            self.sinks.append(
                ModuleSink("trackio", settings.trackio_project, config.run_name, plain)
            )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Send the metrics of step ``step`` to every sink, in order."""
        for sink in self.sinks:
            sink.log(step, metrics)

    def close(self) -> None:
        """Close every sink."""
        for sink in self.sinks:
            sink.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl`` file."""
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_rewards(rows: list[dict[str, Any]], target: Path, title: str) -> Path | None:
    """Reward (mean and pass@1) per step as a PNG, with the held-out evaluation's reward
    (``eval/reward``) where the run has one; ``None`` when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return None
    evals = [r for r in rows if "eval/reward" in r]
    rows = [r for r in rows if "reward/mean" in r]  # the baseline's row (step 0) is eval only
    steps = [r["step"] for r in rows]
    rewards = [r.get("reward/mean") for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4.2), dpi=120)
    ax.plot(steps, rewards, marker="o", markersize=3, linewidth=0.8, alpha=0.6, label="mean reward")
    # A step sees only a few tasks, so its mean is noisy: the trend is the moving average.
    window = min(5, len(rows))
    if window > 1 and all(r is not None for r in rewards):
        averages = [
            sum(rewards[i - window + 1 : i + 1]) / window for i in range(window - 1, len(rows))
        ]
        ax.plot(
            steps[window - 1 :],
            averages,
            linewidth=2.2,
            color="C0",
            label=f"mean reward, {window}-step average",
        )
    if any("pass@1" in r for r in rows):
        ax.plot(
            steps,
            [r.get("pass@1") for r in rows],
            linewidth=0.8,
            linestyle="--",
            color="C1",
            label="pass@1",
        )
    if evals:
        ax.plot(
            [r["step"] for r in evals],
            [r["eval/reward"] for r in evals],
            marker="s",
            linewidth=1.8,
            color="C2",
            label="held-out eval reward",
        )
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    # Below the axes: training reward fills the top, held-out reward the bottom.
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, fontsize="small",
              frameon=False)  # fmt: skip
    fig.tight_layout()
    fig.savefig(target)
    plt.close(fig)
    return target
