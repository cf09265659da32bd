"""``envhub train``: GRPO-family RL on envhub environments, from a YAML config."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    """Add the ``envhub train`` command to ``app``."""
    app.command("train", context_settings={"allow_extra_args": False})(train_command)


def train_command(
    config: str = typer.Argument(
        None, help="YAML config (see examples/; e.g. examples/quickstart.yaml)."
    ),
    overrides: list[str] = typer.Argument(
        None, help="Overrides KEY=VALUE, e.g. optimizer.lr=1e-6 steps=50."
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the resolved config and a size/memory estimate, then stop."
    ),
    example: str = typer.Option(
        None, "--example", help="A config shipped with envhub instead of CONFIG (envhub examples)."
    ),
) -> None:
    """Train a model on one or more envs with GRPO-family RL.

    A progress bar per rollout, a table row per step. The run folder gets metrics,
    trajectories, checkpoints and the final HF model; a crashed run resumes from
    its last checkpoint when started again.

    An env in envs: is a name (envhub list) or your env's code:
    path/to/file.py:Class, path/to/file.py (its only Env subclass) or
    module:Class. From Python: envhub.train(config, overrides).

    Examples:
        envhub train examples/quickstart.yaml
        envhub train examples/quickstart.yaml steps=5 rollout.samples_per_task=4
        envhub train examples/gsm8k-1gpu.yaml --dry-run
        envhub train --example quickstart steps=5
    """
    from envhub.trainer.config import load_config
    from envhub.trainer.env_names import check_env_names

    notes: list[str] = []
    cfg = load_config(*_config_source(config, example, overrides or []), notes=notes)
    if notes:
        from envhub.cli.console import console

        for note in notes:
            console.print(f"[dim]note: {note}[/dim]")
    check_env_names(cfg)  # a bad env name or reference fails here, before any model loads
    _warn_about_tool_calls(cfg)
    if dry_run:
        from envhub.cli.train_view import show_dry_run
        from envhub.trainer.estimate import estimate

        show_dry_run(cfg, estimate(cfg))
        return
    from envhub.cli.train_view import RichReporter
    from envhub.trainer.loop import train

    with RichReporter() as reporter:
        train(cfg, reporter)


def _config_source(
    config: str | None, example: str | None, overrides: list[str]
) -> tuple[Path, list[str]]:
    """The YAML file and the overrides. With ``--example`` there is no CONFIG, so the first
    positional (which click takes for CONFIG) is an override too."""
    from envhub.errors import ConfigError

    if example is None:
        if config is None:
            raise ConfigError(
                "give a config file, or --example NAME for one shipped with envhub "
                "(`envhub examples` lists them)"
            )
        return Path(config), overrides
    if config is not None and "=" not in config:
        raise ConfigError(f"give a config file ({config}) or --example {example}, not both")
    from envhub import examples

    return examples.path(example), ([config] if config is not None else []) + overrides


def _warn_about_tool_calls(cfg: object) -> None:
    """Say so before anything starts when ``rollout.max_tokens`` cannot hold one tool call."""
    from envhub.cli.console import console
    from envhub.trainer.tool_budget import tool_call_warnings

    for warning in tool_call_warnings(cfg):
        console.print(f"[yellow]warning: {warning}[/yellow]")
