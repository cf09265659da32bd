"""``envhub search``: env packages on the Hub."""

from __future__ import annotations

import typer

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

    Examples:
        envhub search capital
        envhub search --author my-org
    """
    print_hub_packages(query, author, limit, token)


def print_hub_packages(
    query: str | None, author: str | None, limit: int, token: str | None
) -> None:
    """The search result as a table (also ``envhub list --hub``); repo ids never wrap."""
    from envhub.cli.console import console, listing
    from envhub.hub.search import search

    packages = search(query, author=author, limit=limit, token=token)
    title = f"envhub packages on the Hub{f' matching {query!r}' if query else ''}"
    rows = [
        [
            p.repo_id,
            p.last_modified[:10],
            "private" if p.private else "public",
            ", ".join(t for t in p.tags if t != "envhub"),
        ]
        for p in packages
    ]
    headers = ("repo", "updated", "visibility", "tags")
    console.print(
        listing(title, headers, rows, console.width, under={"tags": "tags: "}, min_last=MIN_TAGS)
    )
