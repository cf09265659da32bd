"""``envhub list``: the envs this Python environment can make."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the ``envhub list`` command to ``app``."""
    app.command("list")(list_command)


def list_command(
    hub: bool = typer.Option(
        False, "--hub", help="List env packages on the Hub instead (repos tagged envhub)."
    ),
) -> None:
    """List installed envs: name, kind, tools, version and where each comes from.

    Examples:
        envhub list
        envhub list --hub
    """
    if hub:
        from envhub.cli.search import print_hub_packages

        print_hub_packages(None, None, 100, None)
        return
    from rich.table import Table

    from envhub.cli.console import console
    from envhub.registry import list_envs

    table = Table(title="envhub environments", title_justify="left")
    for column in ("name", "kind", "tools", "version", "from", "description"):
        table.add_column(column, overflow="fold")
    for name, spec in sorted(list_envs().items()):
        table.add_row(name, *describe(spec))
    console.print(table)


def describe(spec) -> tuple[str, str, str, str, str]:
    """(kind, tools, version, origin, first docstring line) of an env; a broken env says why."""
    import inspect

    from envhub.env import Env, SingleTurnEnv
    from envhub.errors import EnvLoadError
    from envhub.multiturn import MultiTurnEnv, ToolEnv

    origin = spec.distribution or "this process"
    try:
        target = spec.load()
    except EnvLoadError as e:
        return "[red]broken[/]", "", spec.version or "", origin, str(e)
    kinds = [
        (ToolEnv, "tool"),
        (MultiTurnEnv, "multi-turn"),
        (SingleTurnEnv, "single-turn"),
        (Env, "custom"),
    ]
    kind = next(
        (label for cls, label in kinds if inspect.isclass(target) and issubclass(target, cls)),
        "factory",
    )
    tools = ", ".join(getattr(t, "name", str(t)) for t in getattr(target, "tools", ()))
    version = getattr(target, "version", None) or spec.version or ""
    doc = (inspect.getdoc(target) or "").split("\n")[0]
    return kind, tools, version, origin, doc
