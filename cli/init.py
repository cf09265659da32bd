"""``envhub init``: create an env package from a template."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    """Add the ``envhub init`` command to ``app``."""
    app.command("init")(init_command)


def init_command(
    name: str = typer.Argument(
        ..., help="Package and env name: lowercase letters, digits and hyphens, e.g. my-env."
    ),
    template: str = typer.Option(
        "single-turn", "--template", "-t", help="single-turn | multi-turn | tool | code | agent."
    ),
    directory: Path = typer.Option(
        None, "--dir", help="Folder to create the package in (default: the current folder)."
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="Write into an existing, non-empty folder: "
        "replace the template's files, keep the others.",
    ),
) -> None:
    """Create an env package from a template: an env, tests, a README.

    Templates:
        single-turn   one answer, exact-match reward
        multi-turn    a game with feedback every turn
        tool          a tool that reads hidden per-episode state
        code          a program scored by test cases run in a sandbox

    Examples:
        envhub init my-env
        envhub init guess-my-number --template multi-turn
        envhub init stock-lookup -t tool --dir ./envs
    """
    from envhub.scaffold import create_package, template_files

    path = create_package(name, template, directory, force=force)
    _print_summary(name, template, path, template_files(name, template))


def _print_summary(name: str, template: str, path: Path, files: list[str]) -> None:
    import os
    import shlex

    from rich.markup import escape

    from envhub.cli.console import console

    # soft_wrap: paths and commands stay on one line (copyable), however narrow the terminal.
    console.print(
        f"[green]Created[/] {name} from the {template} template in {escape(str(path))}",
        highlight=False,
        soft_wrap=True,
    )
    for file in files:
        console.print(f"  {escape(file)}", highlight=False, soft_wrap=True)
    steps = [
        (f"cd {shlex.quote(os.path.relpath(path))}", ""),
        ("envhub check .", "run the env contract checks"),
        ("pytest", "run the package's own tests"),
        ("pip install -e .", "install it: envhub finds it by name"),
        (f"envhub eval {name} -m MODEL -u URL", "evaluate a model on it"),
    ]
    width = max(len(command) for command, _ in steps)
    console.print("\n[bold]Next steps[/]", highlight=False, soft_wrap=True)
    for command, note in steps:
        comment = f"  [dim]# {escape(note)}[/]" if note else ""
        console.print(
            f"  {escape(command.ljust(width))}{comment}".rstrip(), highlight=False, soft_wrap=True
        )
