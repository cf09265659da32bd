"""How ``envhub train`` looks: a progress bar per rollout, one table row per step, a summary."""

from __future__ import annotations

from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from envhub.cli.console import console

# (metric, column title, format) for the per-step row
COLUMNS = [
    ("reward/mean", "reward", "{:.3f}"),
    ("reward/std", "±", "{:.2f}"),
    ("pass@1", "pass@1", "{:.2f}"),
    ("rollout/completion_tokens", "tokens", "{:.0f}"),
    ("batch/kept", "kept", "{:.0f}"),
    ("train/loss", "loss", "{:+.4f}"),
    ("train/kl", "kl", "{:.4f}"),
    ("train/entropy", "entropy", "{:.3f}"),
    ("train/clip_frac", "clip", "{:.3f}"),
    ("train/mismatch_kl", "mismatch", "{:.1e}"),
    ("train/grad_norm", "|g|", "{:.2f}"),
    ("throughput/rollout_tokens_per_s", "gen tok/s", "{:.0f}"),
    ("time/rollout", "rollout s", "{:.1f}"),
    ("time/update", "train s", "{:.1f}"),
    ("time/step", "step s", "{:.1f}"),
]


class RichReporter:
    """Renders training progress on the terminal (see :class:`envhub.trainer.loop.Reporter`)."""

    def __init__(self) -> None:
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True)
        self._task: Any = None
        self._rows = 0
        self.steps = 0

    def __enter__(self) -> RichReporter:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def start(self, config: Any, info: dict[str, Any]) -> None:
        self.steps = config.steps
        envs = ", ".join(e.name for e in config.envs)
        resumed = f", resumed at step {info['resumed_from']}" if info.get("resumed_from") else ""
        console.print(
            f"[bold]envhub train[/] {config.model.name} ({info['parameters'] / 1e6:.1f}M params, {info['device']}) on {envs}: "
            f"{config.steps} steps x {config.rollout.tasks_per_step} tasks x {config.rollout.samples_per_task} samples{resumed}",
            soft_wrap=True,
        )
        console.print(f"run folder: {info['run_dir']}", soft_wrap=True)

    def rollout_progress(self, done: int, total: int) -> None:
        if self._task is None:
            self._task = self.progress.add_task("rollout", total=total)
        self.progress.update(self._task, completed=done, total=total)

    def step(self, step: int, metrics: dict[str, float]) -> None:
        if self._task is not None:
            self.progress.remove_task(self._task)
            self._task = None
        console.print(step_row(step, self.steps, metrics, header=self._rows % 20 == 0))
        self._rows += 1

    def finish(self, result: Any) -> None:
        history = result.history
        if history:
            first, last = history[0], history[-1]
            console.print(
                f"[bold]done[/]: reward {first.get('reward/mean', 0):.3f} (step {first['step']}) -> "
                f"{last.get('reward/mean', 0):.3f} (step {last['step']}); best {max(r.get('reward/mean', 0) for r in history):.3f}",
                soft_wrap=True,
            )
        for label, path in (("metrics", result.run_dir / "metrics.jsonl"), ("reward plot", result.plot), ("final model", result.final_model)):
            if path is not None:
                console.print(f"{label}: {path}", soft_wrap=True)


def step_row(step: int, steps: int, metrics: dict[str, float], header: bool) -> Table:
    """One table row (with the header every 20 steps), fixed widths so rows line up."""
    table = Table(show_header=header, box=None, pad_edge=False, padding=(0, 1))
    table.add_column("step", justify="right", width=len(f"{steps}/{steps}"))
    for _, title, _ in COLUMNS:
        table.add_column(title, justify="right", width=max(len(title), 7))
    cells = [f"{step}/{steps}"]
    for key, _, fmt in COLUMNS:
        value = metrics.get(key)
        cells.append("-" if value is None else fmt.format(value))
    table.add_row(*cells)
    return table


def show_dry_run(config: Any, estimate: dict[str, Any]) -> None:
    """The resolved config as YAML, then the size and memory estimate."""
    import yaml
    from rich.syntax import Syntax

    console.print(Syntax(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False), "yaml", theme="ansi_dark"))
    table = Table(title="estimate", show_header=False)
    for key, value in estimate.items():
        table.add_row(key, value)
    console.print(table)
