"""``envhub list``: the envs this Python environment can make."""

from __future__ import annotations

import typer

HEADERS = ("name", "kind", "tools", "version", "from", "description")
MIN_DESCRIPTION = 40
"""The narrowest description column worth a table (a typical docstring line then takes two
lines); narrower, each description goes under its env. At 80 columns the built-ins leave 25."""


def register(app: typer.Typer) -> None:
    """Add the ``envhub list`` command to ``app``."""
    app.command("list")(list_command)


def list_command(
    hub: bool = typer.Option(
        False, "--hub", help="List env packages on the Hub instead (repos tagged envhub)."
    ),
) -> None:
    """List installed envs: name, kind, tools, version and origin.

    An env that fails to load is listed as broken, with the reason. Other
    frameworks' envs that an adapter can make (verifiers:NAME, ...) are listed
    with their framework as kind and origin.

    Examples:
        envhub list
        envhub list --hub
    """
    if hub:
        from envhub.cli.search import print_hub_packages

        print_hub_packages(None, None, 100, None)
        return
    from rich.text import Text

    from envhub.adapters import list_adapted, split_adapted
    from envhub.cli.console import console, listing
    from envhub.registry import list_envs

    rows = []
    for name, spec in sorted(list_envs().items()):
        kind, *rest = describe(spec)
        rows.append([name, Text(kind, style="red" if kind == "broken" else ""), *rest])
    for name, description in sorted(list_adapted().items()):  # other frameworks' envs
        framework, _ = split_adapted(name) or ("adapted", "")
        rows.append([name, Text(framework), "", "", framework, description])
    under = {"description": "", "tools": "tools: "}
    title = "envhub environments"
    console.print(
        listing(title, HEADERS, rows, console.width, under=under, min_last=MIN_DESCRIPTION)
    )


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
        return "broken", "", spec.version or "", origin, str(e)
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
