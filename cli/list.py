"""``envhub list``: the envs this Python environment can make."""

from __future__ import annotations

import re

import typer

HEADERS = ("name", "kind", "tools", "version", "from", "description")
MIN_DESCRIPTION = 40
"""The narrowest description column worth a table (a typical docstring line then takes two
lines); narrower, each description goes under its env. At 80 columns the built-ins leave 25."""


def register(app: typer.Typer) -> None:
    """Add the ``envhub list`` command to ``app``."""
    app.command("list")(list_command)


def list_command(
    file: str = typer.Argument(
        None, help="An env file: list the Env classes it defines, by the reference to use."
    ),
    hub: bool = typer.Option(
        False, "--hub", help="List env packages on the Hub instead (repos tagged envhub)."
    ),
    framework: str = typer.Option(
        None, "--framework", help="List another framework's envs: verifiers, openenv or gem."
    ),
) -> None:
    """List installed envs: name, kind, tools, version and origin.

    An env that fails to load is listed as broken, with the reason. Each other
    framework installed here gets one row (gem:*, ...); --framework lists its
    envs, which envhub eval, check and train take by those names.

    Given a Python file, it lists the Env classes that file defines, each by
    the reference (path/file.py:Class) that check, eval, train and serve take.

    Examples:
        envhub list
        envhub list my_env.py
        envhub list --framework gem
        envhub list --hub
    """
    if hub:
        from envhub.cli.search import print_hub_packages

        print_hub_packages(None, None, 100, None)
        return
    from envhub.cli.console import console, listing

    title = "envhub environments"
    if file is not None:
        rows = file_rows(file)
        title = f"envs in {file}"
    elif framework is not None:
        rows = adapted_rows(framework)
        title = f"{framework} environments"
    else:
        rows = registered_rows() + framework_rows()
    under = {"description": "", "tools": "tools: "}
    console.print(
        listing(title, HEADERS, rows, console.width, under=under, min_last=MIN_DESCRIPTION)
    )


def registered_rows() -> list[list]:
    """A row per env of the registry (built-ins and installed packages)."""
    from rich.text import Text

    from envhub.registry import list_envs

    rows = []
    for name, spec in sorted(list_envs().items()):
        kind, *rest = describe(spec)
        rows.append([name, Text(kind, style="red" if kind == "broken" else ""), *rest])
    return rows


def file_rows(file: str) -> list[list]:
    """A row per Env subclass that ``file`` defines, named by its reference."""
    from envhub.errors import EnvNotFoundError
    from envhub.references import file_env_classes
    from envhub.registry import EnvSpec

    classes = file_env_classes(file)
    if not classes:
        raise EnvNotFoundError(f"{file} defines no subclass of envhub.Env")
    rows = []
    for reference, cls in classes.items():
        kind, tools, version, _, doc = describe(EnvSpec(reference, cls))
        rows.append([reference, kind, tools, version, file, doc])
    return rows


def framework_rows() -> list[list]:
    """One row per other framework installed here, saying how to list its envs (importing a
    framework to count them would cost seconds: GEM alone 1.2 s)."""
    from envhub.adapters import FRAMEWORK_TITLES, installed_frameworks

    return [
        [f"{prefix}:*", prefix, "", "", prefix, FRAMEWORK_TITLES[prefix]]
        for prefix in installed_frameworks()
    ]  # fmt: skip


def adapted_rows(framework: str) -> list[list]:
    """A row per env that ``framework``'s adapter can make here."""
    from envhub.adapters import ADAPTERS, list_adapted
    from envhub.errors import ConfigError

    if framework not in ADAPTERS:
        raise ConfigError(f"no adapter for {framework!r}; available: {', '.join(ADAPTERS)}")
    return [
        [name, framework, "", "", framework, plain_rest(description)]
        for name, description in sorted(list_adapted(framework).items())
    ]


def describe(spec) -> tuple[str, str, str, str, str]:
    """(kind, tools, version, origin, first docstring line) of an env; a broken env says why."""
    import inspect

    from envhub.errors import EnvLoadError
    from envhub.package import env_kind, tool_names

    origin = spec.distribution or "this process"
    try:
        target = spec.load()
    except EnvLoadError as e:
        return "broken", "", spec.version or "", origin, str(e)
    kind = env_kind(target)
    tools = ", ".join(tool_names(target))
    version = getattr(target, "version", None) or spec.version or ""
    doc = (inspect.getdoc(target) or "").split("\n")[0]
    return kind, tools, version, origin, plain_rest(doc)


_ROLE = re.compile(r":[\w:.-]+:`([^`]+)`")
_LITERAL = re.compile(r"``(.+?)``")
_INTERPRETED = re.compile(r"(?<![\w`])`([^`]+)`(?![\w`])")


def plain_rest(text: str) -> str:
    """A docstring line's reST inline markup as plain text: ````code```` and ```text```
    lose their backquotes, a role (``:func:`target```) becomes its target (see :func:`_role`)."""
    text = _ROLE.sub(_role, text)
    return _INTERPRETED.sub(r"\1", _LITERAL.sub(r"\1", text))


def _role(match: re.Match[str]) -> str:
    """``title <target>``: the title; ``~a.b.C``: ``C``; else the target."""
    content = match.group(1)
    if content.endswith(">") and "<" in content:
        return content[: content.index("<")].strip()
    return content[1:].rsplit(".", 1)[-1] if content.startswith("~") else content
