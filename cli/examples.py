"""``envhub examples``: the training configs shipped in the package, listed, printed or copied."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    """Add the ``envhub examples`` command to ``app``."""
    app.command("examples")(examples_command)


def examples_command(
    name: str = typer.Argument(None, help="An example to print (default: list them all)."),
    copy: Path = typer.Option(
        None, "--copy", help="Write the example (all of them without NAME) into this folder."
    ),
) -> None:
    """List the training configs shipped with envhub, print one, or copy them out to edit.

    Examples:
        envhub examples
        envhub examples quickstart > my-run.yaml
        envhub examples quickstart --copy configs/
        envhub train --example quickstart
    """
    from envhub import examples

    if copy is not None:
        _copy(examples.names() if name is None else [name], copy)
    elif name is not None:
        typer.echo(examples.path(name).read_text(), nl=False)  # plain text: fit for `> x.yaml`
    else:
        _print_table()


def _print_table() -> None:
    from rich.table import Table

    from envhub import examples
    from envhub.cli.console import console

    table = Table(title="envhub example configs", title_justify="left")
    table.add_column("name", no_wrap=True)
    table.add_column("description", overflow="fold")
    for name in examples.names():
        table.add_row(name, examples.description(name))
    console.print(table)
    console.print(
        "train on one: envhub train --example NAME; print one: envhub examples NAME; "
        "copy one to edit: envhub examples NAME --copy DIR",
        highlight=False,
        soft_wrap=True,
    )


def _copy(names: list[str], folder: Path) -> None:
    """Write each example into ``folder``; an existing file is never overwritten."""
    from envhub import examples
    from envhub.cli.console import console
    from envhub.errors import ConfigError

    sources = [examples.path(name) for name in names]  # every name checked before any write
    taken = [str(folder / s.name) for s in sources if (folder / s.name).exists()]
    if taken:
        raise ConfigError(f"not overwriting {', '.join(taken)}: remove it or copy elsewhere")
    folder.mkdir(parents=True, exist_ok=True)
    for source in sources:
        target = folder / source.name
        target.write_text(source.read_text())
        console.print(
            f"wrote {target}; train with: envhub train {target}", highlight=False, soft_wrap=True
        )
