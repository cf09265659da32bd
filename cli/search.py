"""``envhub search``: env packages on the Hub."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from envhub.hub.search import HubPackage

MIN_TAGS = 20
"""The narrowest tags column worth a table; narrower, each package's tags go under it."""


def register(app: typer.Typer) -> None:
    """Add the ``envhub search`` command to ``app``."""
    app.command("search")(search_command)


def search_command(
    query: str = typer.Argument(
        None, help="Text the repo name contains (none: every env package)."
    ),
    author: str = typer.Option(
        None, "--author", help="Only this user's or organisation's packages."
    ),
    limit: int = typer.Option(50, "--limit", min=1, help="Most packages to list."),
    token: str = typer.Option(
        None, "--token", envvar="HF_TOKEN", help="Hub token (to see your private packages)."
    ),
) -> None:
    """Find env packages on the Hub (repos tagged `envhub`).

    Your token (--token, HF_TOKEN or `hf auth login`) also shows private ones.
    The performance column: episodes/s and step p50 of each package's slowest
    env, measured by `envhub check` on the machine that pushed it.

    Examples:
        envhub search capital
        envhub search --author my-org
    """
    print_hub_packages(query, author, limit, token)


def print_hub_packages(
    query: str | None, author: str | None, limit: int, token: str | None
) -> None:
    """The search result as a table (also ``envhub list --hub``); repo ids never wrap.

    A performance column (episodes/s and step p50 of each package's slowest env, as measured on
    the pushing machine) shows when a listed package has the numbers on its card.
    """
    from envhub.cli.console import console, listing
    from envhub.hub.search import search

    packages = search(query, author=author, limit=limit, token=token)
    title = f"envhub packages on the Hub{f' matching {query!r}' if query else ''}"
    measured = any(p.performance for p in packages)
    rows = [
        [
            p.repo_id,
            p.last_modified[:10],
            "private" if p.private else "public",
            *([speed(p)] if measured else []),
            ", ".join(t for t in p.tags if t != "envhub"),
        ]
        for p in packages
    ]
    headers = ("repo", "updated", "visibility", *(["performance"] if measured else []), "tags")
    under = {"performance": "", "tags": "tags: "} if measured else {"tags": "tags: "}
    console.print(listing(title, headers, rows, console.width, under=under, min_last=MIN_TAGS))


def speed(package: HubPackage) -> str:
    """``850 ep/s, step p50 40 µs`` of the package's slowest env (``slowest of 2`` added when it
    has more than one); empty without numbers."""
    from envhub.evaluation.perf import format_ms, format_rate

    slowest = package.slowest()
    if slowest is None:
        return ""
    name, numbers = slowest
    count = len(package.performance["envs"])
    rate, step = format_rate(numbers["episodes_per_s"]), format_ms(numbers["step_p50_ms"])
    return f"{rate} ep/s, step p50 {step}" + (f" ({name}, slowest of {count})" * (count > 1))
