"""``envhub search``: env packages on the Hub."""

from __future__ import annotations

import typer


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
    limit: int = typer.Option(50, "--limit", min=1),
    token: str = typer.Option(
        None, "--token", envvar="HF_TOKEN", help="Hub token (to see your private packages)."
    ),
) -> None:
    """Find env packages on the Hub (repos tagged `envhub`).

    Examples:
        envhub search capital
        envhub search --author my-org
    """
    print_hub_packages(query, author, limit, token)


def print_hub_packages(
    query: str | None, author: str | None, limit: int, token: str | None
) -> None:
    """The search result as a table (also ``envhub list --hub``)."""
    from rich.table import Table

    from envhub.cli.console import console
    from envhub.hub.search import search

    packages = search(query, author=author, limit=limit, token=token)
    table = Table(
        title=f"envhub packages on the Hub{f' matching {query!r}' if query else ''}",
        title_justify="left",
    )
    for column in ("repo", "tags", "updated", "visibility"):
        table.add_column(column, overflow="fold")
    for p in packages:
        tags = ", ".join(t for t in p.tags if t not in ("envhub",))
        table.add_row(p.repo_id, tags, p.last_modified[:10], "private" if p.private else "public")
    console.print(table)
