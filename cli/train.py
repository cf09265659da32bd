"""``envhub train``: GRPO-family RL on envhub environments, from a YAML config."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    """Add the ``envhub train`` command to ``app``."""
    app.command("train", context_settings={"allow_extra_args": False})(train_command)


def train_command(
    config: Path = typer.Argument(
        ..., help="YAML config (see examples/; e.g. examples/quickstart.yaml)."
    ),
    overrides: list[str] = typer.Argument(
        None, help="Overrides KEY=VALUE, e.g. optimizer.lr=1e-6 steps=50."
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the resolved config and a size/memory estimate, then stop."
    ),
) -> None:
    """Train a model on one or more envs with GRPO-family RL.

    A progress bar per rollout, a table row per step; metrics, trajectories, checkpoints (a
    crashed run resumes when started again) and the final HF model under the run folder.

    Examples:
        envhub train examples/quickstart.yaml
        envhub train examples/quickstart.yaml steps=5 rollout.samples_per_task=4
        envhub train examples/gsm8k-1gpu.yaml --dry-run
    """
    from envhub.trainer.config import load_config

    cfg = load_config(config, overrides or [])
    if dry_run:
        from envhub.cli.train_view import show_dry_run
        from envhub.trainer.estimate import estimate

        show_dry_run(cfg, estimate(cfg))
        return
    from envhub.cli.train_view import RichReporter
    from envhub.trainer.loop import train

    with RichReporter() as reporter:
        train(cfg, reporter)
