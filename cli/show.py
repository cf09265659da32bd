"""``envhub show``: look at saved results: the summary, or one episode turn by turn."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    """Add the ``envhub show`` command to ``app``."""
    app.command("show")(show_command)


def show_command(
    results: Path = typer.Argument(
        ...,
        help="A results folder written by `envhub eval`, or a trajectories file (an eval's "
        "trajectories.jsonl, a training step's trajectories/step-N.jsonl).",
    ),
    episode: int = typer.Option(
        None, "--episode", "-e", help="Show this episode (its line number in the file, from 0)."
    ),
    worst: bool = typer.Option(False, "--worst", help="Show the lowest-reward episode."),
) -> None:
    """Print the summary of saved results, or one episode turn by turn.

    An episode shows its messages, rewards, tool calls, errors and token counts.

    Examples:
        envhub show outputs/eval/calculator-smollm2-20261123-091258
        envhub show outputs/eval/calculator-smollm2-20261123-091258 -e 3
        envhub show --worst outputs/train/my-run/trajectories/step-000020.jsonl
    """
    from envhub.cli.console import console
    from envhub.cli.eval import summary_table, task_table
    from envhub.errors import ConfigError
    from envhub.evaluation import summarize
    from envhub.rollout.io import read_trajectories

    file = results / "trajectories.jsonl" if results.is_dir() else results
    if not file.is_file():
        raise ConfigError(
            f"{results} holds no trajectories.jsonl; give a folder written by `envhub eval`"
        )
    trajectories = read_trajectories(file)
    if not trajectories:
        raise ConfigError(f"{file} is empty")
    if episode is None and not worst:
        saved = _saved_summary(file)
        summary = summarize(
            trajectories, saved.get("pass_threshold", 1.0), saved.get("seconds", 0.0)
        )
        console.print(
            summary_table(summary, str(file.parent if file.name == "trajectories.jsonl" else file))
        )
        if summary.per_task:
            console.print(task_table(summary.per_task))
        return
    index = (
        min(range(len(trajectories)), key=lambda i: trajectories[i].reward) if worst else episode
    )
    if not 0 <= index < len(trajectories):
        raise ConfigError(f"--episode must be 0..{len(trajectories) - 1}")
    render_episode(console, trajectories[index], index)


def _saved_summary(file: Path) -> dict:
    """What `envhub eval` saved next to its trajectories (pass threshold, wall time), if any."""
    import json

    path = file.with_name("summary.json")
    return (
        json.loads(path.read_text()) if file.name == "trajectories.jsonl" and path.is_file() else {}
    )


def render_episode(console, trajectory, index: int) -> None:
    """One episode: a header line, each message in a panel, then errors and drift."""
    from rich.markup import escape
    from rich.panel import Panel

    t = trajectory
    parts = ", ".join(f"{k} {v:g}" for k, v in t.reward_components.items())
    console.print(
        f"[bold]episode {index}[/]: {escape(episode_label(t))} task {t.task_index} "
        f"sample {t.sample_index} | reward {t.reward:g} ({parts}) | {t.stop_reason}, "
        f"{t.outcome} | {len(t.turns)} turns, {t.num_completion_tokens} tokens",
        soft_wrap=True,
    )
    if t.sampler is not None:
        console.print(f"sampled by {sampler_line(t.sampler)}", soft_wrap=True, markup=False)
    rescore = t.info.get("rescore") or {}
    if "reward" in rescore:  # written by `envhub rescore`
        before = rescore["env"]
        diverged = f"; replay diverged: {rescore['divergence']}" if rescore["divergence"] else ""
        console.print(
            f"rescored from {before['name']} v{before['version']}: reward {rescore['reward']:g} "
            f"-> {t.reward:g}{diverged}",
            soft_wrap=True,
            markup=False,
        )
    styles = {"system": "dim", "user": "cyan", "assistant": "green", "tool": "yellow"}
    for m in t.messages:
        title = (
            m.role
            + (f" -> {m.name}" if m.name else "")
            + (f" ({len(m.tool_calls)} tool calls)" if m.tool_calls else "")
        )
        console.print(
            Panel(m.content or "", title=title, title_align="left", border_style=styles[m.role]),
            markup=False,
        )
    for e in t.errors:
        console.print(
            f"[red]error[/] at {e.stage} (turn {e.turn}): {e.type}: {e.message}", soft_wrap=True
        )
    for d in t.token_drift:
        console.print(
            f"[yellow]token drift[/] at turn {d['turn']}, token {d['position']}", soft_wrap=True
        )


def episode_label(trajectory) -> str:
    """What produced an episode: ``harbor v0.1.0``, or with a named task (a Harbor task's
    ``[task] name``, recorded as ``info["task"]``) ``org/count-lines (harbor v0.1.0)``."""
    env = f"{trajectory.env.name} v{trajectory.env.version}"
    task = trajectory.info.get("task")
    return f"{task} ({env})" if isinstance(task, str) and task else env


def sampler_line(sampler) -> str:
    """``openai (tokens), model m, version 0.11.0, temperature 0.7, template 1a2b3c4d5e6f``:
    what sampled an episode, in one line."""
    parts = [sampler.engine + (f" ({sampler.mode})" if sampler.mode else "")]
    if sampler.model:
        parts.append(f"model {sampler.model}")
    if sampler.version:
        parts.append(f"version {sampler.version}")
    if "temperature" in sampler.sampling:
        parts.append(f"temperature {sampler.sampling['temperature']:g}")
    if sampler.chat_template_sha256:
        parts.append(f"template {sampler.chat_template_sha256[:12]}")
    return ", ".join(parts)
