"""``envhub rescore``: recompute the rewards of saved trajectories with another env version."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer


def register(app: typer.Typer) -> None:
    """Add the ``envhub rescore`` command to ``app``."""
    app.command("rescore")(rescore_command)


def rescore_command(
    results: Path = typer.Argument(
        ...,
        help="An `envhub eval` folder, an `envhub train` run folder, or a trajectories file.",
    ),
    env: str = typer.Option(
        ..., "--env", "-e", help="Env to score with: a name, or owner/name@version (Hub)."
    ),
    output: Path = typer.Option(
        None, "--output", "-o", help="Folder for the new results (default: next to RESULTS)."
    ),
    env_args: list[str] = typer.Option(
        [],
        "--env-arg",
        "-a",
        metavar="KEY=VALUE",
        help="Env argument, over those the results were made with; repeatable.",
    ),
    trust_remote_code: bool = typer.Option(
        False, "--trust-remote-code", help="Install a Hub env not installed yet (runs its code)."
    ),
    concurrency: int = typer.Option(8, help="Groups replayed at once."),
) -> None:
    """Re-score saved trajectories with another env version (no generation).

    Each episode is replayed through the env: reset with its seed and task,
    stepped with the saved turns, scored again (group rewards per group).
    The originals stay as they are. The new trajectories, and rescore.json
    saying what changed, go to --output (default: RESULTS-rescored-ENV-VER).

    Examples:
        envhub rescore outputs/eval/calculator-smollm2 --env calculator
        envhub rescore outputs/train/my-run -e alice/wordle@0.2.0 \\
            --trust-remote-code
    """
    from envhub.cli.console import console
    from envhub.cli.eval import parse_env_args
    from envhub.evaluation.rescore import (
        find_results,
        report_lines,
        rescore_results,
        stored_env_args,
    )

    source = find_results(results)  # a path with no trajectories fails before any env is made
    kwargs = stored_env_args(source, env) | parse_env_args(env_args)
    factory = env_factory(env, kwargs, trust_remote_code)
    folder = output or default_output(results, factory)
    report = rescore_results(results, factory, folder, concurrency)
    for line in report_lines(report):
        console.print(line, soft_wrap=True, markup=False, highlight=False)


def env_factory(reference: str, kwargs: dict[str, Any], trust: bool):
    """Makes the env ``reference`` with ``kwargs`` (and, for a Hub reference, the user's trust)."""
    from envhub import make
    from envhub.loader import is_hub_reference

    extra = {"trust_remote_code": True} if trust and is_hub_reference(reference) else {}
    return lambda: make(reference, **kwargs, **extra)


def default_output(results: Path, factory) -> Path:
    """``RESULTS-rescored-NAME-VERSION`` next to the results (a file's stem for a file)."""
    import re

    from envhub.hub.provenance import env_ref

    with factory() as probe:  # a bad reference or argument fails here, in a second
        ref = env_ref(probe)
    base = results.with_suffix("") if results.is_file() else results
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{ref.name}-{ref.version}")
    return base.parent / f"{base.name}-rescored-{slug}"
