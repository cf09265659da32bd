"""How ``envhub train`` looks: a progress bar per rollout, one table row per step, a summary."""

from __future__ import annotations

from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from envhub.cli.console import console
from envhub.cli.heartbeat import Heartbeat

# (metric, column title, format, width, priority) of the per-step row. On a narrow terminal the
# lowest priorities go first; output that is not a terminal (a log file) keeps every column.
COLUMNS = [
    ("reward/mean", "reward", "{:.3f}", 6, 0),
    ("reward/std", "±", "{:.2f}", 4, 3),
    ("pass@1", "pass@1", "{:.2f}", 6, 1),
    ("rollout/completion_tokens", "tokens", "{:.0f}", 6, 2),
    ("batch/kept", "kept", "{:.0f}", 4, 2),
    ("train/loss", "loss", "{:+.4f}", 7, 1),
    ("train/kl", "kl", "{:.4f}", 6, 3),
    ("train/entropy", "entropy", "{:.3f}", 7, 2),
    ("train/clip_frac", "clip", "{:.3f}", 5, 3),
    ("train/mismatch_kl", "mismatch", "{:.1e}", 8, 3),
    ("train/grad_norm", "|g|", "{:.2f}", 5, 3),
    ("throughput/rollout_tokens_per_s", "gen tok/s", "{:.0f}", 9, 2),
    ("time/rollout", "gen s", "{:.1f}", 5, 2),
    ("time/update", "train s", "{:.1f}", 7, 2),
    ("time/sync", "sync s", "{:.2f}", 6, 2),
    ("time/step", "step s", "{:.1f}", 6, 0),
]
EVAL_COLUMN = ("eval/reward", "eval", "{:.3f}", 5, 1)
"""Held-out reward (``eval:``), after pass@1, in runs that evaluate; ``-`` between evaluations."""
SFT_COLUMN = ("sft/epoch", "epoch", "{:.2f}", 5, 1)
"""In runs with a warm start (``sft:``), after the step: the passes over the demonstrations
so far (``-`` in RL steps, whose ``loss`` is the policy's, not the demonstrations')."""
CRITIC_COLUMNS = [
    ("critic/explained_variance", "ev", "{:+.2f}", 5, 1),
    ("critic/value_loss", "v loss", "{:.4f}", 6, 2),
]
"""In runs with a critic (``advantage: gae``), after the policy's loss: how much of the returns
the values the step used explained, and the critic's loss."""
LOG_WIDTH = 200
"""Width of the table when output goes to a file or pipe (rich would assume 80 columns)."""


def step_width(steps: int) -> int:
    """Width of the step column: ``steps/steps``, or its header when that is wider (a run of
    under 10 steps printed ``st…`` over ``3/5``)."""
    return max(len("step"), len(f"{steps}/{steps}"))


def columns_for(
    width: int, steps: int, evaluates: bool = False, critic: bool = False, sft: bool = False
) -> list[tuple[str, str, str, int, int]]:
    """The columns that fit in ``width`` characters, dropping low-priority ones first
    (``evaluates``: the run has held-out evaluation, which gets a column; ``critic``: it trains
    a critic, whose explained variance and loss get two; ``sft``: it has supervised steps,
    whose epoch gets one first)."""
    chosen = [*COLUMNS[:3], EVAL_COLUMN, *COLUMNS[3:]] if evaluates else list(COLUMNS)
    if sft:
        chosen.insert(0, SFT_COLUMN)
    if critic:
        after_loss = [c[0] for c in chosen].index("train/loss") + 1
        chosen[after_loss:after_loss] = CRITIC_COLUMNS
    used = step_width(steps) + sum(c[3] + 1 for c in chosen)
    for priority in (3, 2, 1):
        for column in [c for c in reversed(chosen) if c[4] == priority]:
            if used <= width:
                return chosen
            chosen.remove(column)
            used -= column[3] + 1
    return chosen


class RichReporter:
    """Renders training progress on the terminal (see :class:`envhub.trainer.loop.Reporter`)."""

    def __init__(self) -> None:
        if not console.is_terminal:
            console.width = max(console.width, LOG_WIDTH)
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self._task: Any = None
        self._rows = 0
        self.steps = 0
        self.evaluates = False
        self.critic = False
        self.sft = False
        self.heartbeat: Heartbeat | None = None
        """Off a terminal, a line every ``logging.heartbeat_seconds`` (the bar shows nothing)."""

    def __enter__(self) -> RichReporter:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()
        self.progress.stop()

    def start(self, config: Any, info: dict[str, Any]) -> None:
        """Print the run's header: model, envs, run size, run folder, rollout engine, the
        core split and whether async can gain, and the workers."""
        self.steps = config.total_steps
        self.evaluates = getattr(config, "eval", None) is not None
        self.critic = config.algorithm.needs_critic
        self.sft = bool(config.sft_steps)
        every = config.logging.heartbeat_seconds
        if every is not None and not console.is_terminal:
            self.heartbeat = Heartbeat(every, config.total_steps, _print_line)
            self.heartbeat.finish_step(info.get("resumed_from") or 0)
            self.heartbeat.start()
        envs = ", ".join(e.name for e in config.envs)
        resumed = f", resumed at step {info['resumed_from']}" if info.get("resumed_from") else ""
        console.print(
            f"[bold]envhub train[/] {config.model.name} "
            f"({info['parameters'] / 1e6:.1f}M params, {info['device']}) on {envs}: "
            f"{_supervised(config)}{config.steps} step{'s' if config.steps != 1 else ''} x "
            f"{config.rollout.tasks_per_step} tasks "
            f"x {config.rollout.samples_per_task} samples{resumed}",
            soft_wrap=True,
        )
        console.print(f"run folder: {info['run_dir']}", soft_wrap=True)
        if "sync/seconds" in info:
            check = (
                f", logprobs match to {info['sync/logprob_diff_max']:.1e}"
                if "sync/logprob_diff_max" in info
                else ""
            )
            console.print(
                f"rollout engine: {info.get('engine')} "
                f"(initial weight sync {info['sync/seconds']:.2f} s{check})",
                soft_wrap=True,
            )
        if info.get("cores"):
            console.print(f"cores: {info['cores']}", soft_wrap=True)
        if info.get("advice"):
            console.print(f"[yellow]{info['advice']}[/]", soft_wrap=True)
        if info.get("tools"):
            console.print(f"tools: {info['tools']}", soft_wrap=True)
        if info.get("sft"):
            console.print(f"warm start: {info['sft']}", soft_wrap=True)
        if info.get("teacher"):
            console.print(f"teacher: {info['teacher']}", soft_wrap=True)
        if info.get("eval"):
            console.print(f"held-out eval: {info['eval']}", soft_wrap=True)
        if info.get("critic"):
            console.print(f"critic: {info['critic']}", soft_wrap=True)
        if info.get("rollout_workers"):
            where = ", ".join(f"pid {w['pid']} on {w['node']}" for w in info["rollout_workers"])
            console.print(
                f"rollout workers: {len(info['rollout_workers'])} Ray actors ({where})",
                soft_wrap=True,
            )

    def rollout_progress(self, done: int, total: int) -> None:
        """Advance the step's rollout progress bar, adding it on the first call of a step."""
        if self.heartbeat is not None:
            self.heartbeat.progress(done, total)
        if self._task is None:
            self._task = self.progress.add_task("rollout", total=total)
        self.progress.update(self._task, completed=done, total=total)

    def phase(self, name: str) -> None:
        """Tell the heartbeat, if any, the phase the run entered."""
        if self.heartbeat is not None:
            self.heartbeat.enter(name)

    def step(self, step: int, metrics: dict[str, float]) -> None:
        """Drop the rollout bar and print the step's table row, with the header every 20 rows."""
        if self.heartbeat is not None:
            self.heartbeat.finish_step(step)
        if self._task is not None:
            self.progress.remove_task(self._task)
            self._task = None
        columns = columns_for(console.width, self.steps, self.evaluates, self.critic, self.sft)
        console.print(
            step_row(step, self.steps, metrics, header=self._rows % 20 == 0, columns=columns)
        )
        self._rows += 1

    def finish(self, result: Any) -> None:
        """Print the reward at the first and last step and the best, the held-out reward before
        and after, then where the outputs are."""
        if self.heartbeat is not None:
            self.heartbeat.stop()
        history = [r for r in result.history if "reward/mean" in r]  # not the baseline's row
        evals = [r for r in result.history if "eval/reward" in r]
        warm_start = warm_start_summary(result.history)
        if warm_start:
            console.print(warm_start, soft_wrap=True)
        if history:
            first, last = history[0], history[-1]
            console.print(
                f"[bold]done[/]: reward {first.get('reward/mean', 0):.3f} "
                f"(step {first['step']}) -> {last.get('reward/mean', 0):.3f} "
                f"(step {last['step']}); best {max(r.get('reward/mean', 0) for r in history):.3f}",
                soft_wrap=True,
            )
        drift = drift_summary(history)
        if drift:
            console.print(drift, soft_wrap=True)
        if len(evals) > 1:
            console.print(
                f"held-out: reward {evals[0]['eval/reward']:.3f} (step {evals[0]['step']}) -> "
                f"{evals[-1]['eval/reward']:.3f} (step {evals[-1]['step']})",
                soft_wrap=True,
            )
        unchanged = never_learned(result.history)
        if unchanged:
            console.print(unchanged, soft_wrap=True)
        for label, path in (
            ("metrics", result.run_dir / "metrics.jsonl"),
            ("reward plot", result.plot),
            ("final model" + (" (the starting weights)" if unchanged else ""), result.final_model),
        ):
            if path is not None:
                console.print(f"{label}: {path}", soft_wrap=True)


def never_learned(history: list[dict[str, Any]]) -> str | None:
    """What to say at the end of a run none of whose steps had anything to learn from (so its
    weights never changed), or ``None``."""
    steps = [r for r in history if "reward/mean" in r]
    supervised = any("sft/epoch" in r for r in history)
    if not steps or supervised or not all(r.get("train/no_signal") for r in steps):
        return None
    passed = max(r.get("pass@1", 0.0) for r in steps)
    why = (
        "no episode passed, so RL had nothing to reinforce: show the model how first, with a "
        "warm start (sft:) or a teacher (distill:); docs: 'When RL has nothing to learn from'"
        if passed == 0
        else "the warnings above say why for each step"
    )
    return (
        f"[bold yellow]nothing learned[/]: each of the {len(steps)} steps trained on nothing, "
        f"so the weights never changed; {why}"
    )


def warm_start_summary(history: list[dict[str, Any]]) -> str | None:
    """``warm start: demonstrations' loss 0.726 (step 1) -> 0.001 (step 16), 2.00 epochs``
    over a run's supervised steps, or ``None`` when it had none."""
    supervised = [r for r in history if "sft/epoch" in r]
    if not supervised:
        return None
    first, last = supervised[0], supervised[-1]
    return (
        f"[bold]warm start[/]: demonstrations' loss {first['train/loss']:.3f} "
        f"(step {first['step']}) -> {last['train/loss']:.3f} (step {last['step']}), "
        f"{last['sft/epoch']:.2f} epochs"
    )


def _supervised(config: Any) -> str:
    """``"3 supervised steps, then "`` for a run with a warm start (``""`` without)."""
    steps = config.sft_steps
    return f"{steps} supervised step{'s' if steps != 1 else ''}, then " if steps else ""


def drift_summary(history: list[dict[str, Any]]) -> str | None:
    """``token drift: 3 episodes (steps 2, 5): <what it is and what to do>`` over the run's
    steps, or ``None`` when no episode drifted."""
    from envhub.cli.eval import drift_line

    steps = [r["step"] for r in history if r.get("rollout/token_drift")]
    if not steps:
        return None
    total = int(sum(r.get("rollout/token_drift", 0) for r in history))
    shown = ", ".join(map(str, steps[:5])) + (", ..." if len(steps) > 5 else "")
    count, _, hint = drift_line(total).partition(": ")
    return f"token drift: {count} (step{'s' if len(steps) > 1 else ''} {shown}): {hint}"


def _print_line(text: str) -> None:
    console.print(text, highlight=False, markup=False, soft_wrap=True)


def step_row(
    step: int,
    steps: int,
    metrics: dict[str, float],
    header: bool,
    columns: list[tuple[str, str, str, int, int]] = COLUMNS,
) -> Table:
    """One table row (with the header every 20 steps), fixed widths so rows line up."""
    table = Table(
        show_header=header, box=None, pad_edge=False, padding=(0, 1, 0, 0), header_style="bold"
    )
    table.add_column("step", justify="right", width=step_width(steps), no_wrap=True)
    for _, title, _, width, _ in columns:
        table.add_column(title, justify="right", width=max(width, len(title)), no_wrap=True)
    cells = [f"{step}/{steps}"]
    for key, _, fmt, _, _ in columns:
        value = metrics.get(key)
        cells.append("-" if value is None else fmt.format(value))
    table.add_row(*cells)
    return table


def show_dry_run(config: Any, estimate: dict[str, Any]) -> None:
    """The resolved config as YAML, then the size and memory estimate."""
    import yaml
    from rich.syntax import Syntax

    console.print(
        Syntax(
            yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False),
            "yaml",
            theme="ansi_dark",
        )
    )
    table = Table(title="estimate", show_header=False)
    table.add_column(no_wrap=True)  # "activations per micro-batch" stays one line; values wrap
    table.add_column()
    for key, value in estimate.items():
        table.add_row(key, value)
    console.print(table)
