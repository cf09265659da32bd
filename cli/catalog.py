"""``envhub catalog``: one self-contained HTML page of the Hub's env packages."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    """Add the ``envhub catalog`` command to ``app``."""
    app.command("catalog")(catalog_command)


def catalog_command(
    out: Path = typer.Option(Path("catalog.html"), "--out", "-o", help="The HTML file to write."),
    author: str = typer.Option(
        None, "--author", help="Only this user's or organisation's packages."
    ),
    search: str = typer.Option(
        None, "--search", help="Only packages whose repo name contains this text."
    ),
    limit: int = typer.Option(1000, "--limit", min=1, help="Most packages to list."),
    token: str = typer.Option(
        None, "--token", envvar="HF_TOKEN", help="Hub token (to list your private packages)."
    ),
) -> None:
    """Write a page of the Hub's env packages (the ones `envhub search` lists).

    Each package shows its description, envs (kind, tools, reward audit),
    versions, check verdict, performance card, the leaderboard of its latest
    version and the command that installs it; the page searches and filters
    by kind, tool and tag. It is one file that needs no server and no
    network: open it in a browser.

    Examples:
        envhub catalog
        envhub catalog --author my-org --out my-org.html
    """
    from envhub.cli.console import console
    from envhub.hub.catalog import write_catalog

    target, document = write_catalog(out, search, author=author, limit=limit, token=token)
    skipped = len(document["skipped"])
    console.print(
        f"Wrote {target} ({len(document['packages'])} packages"
        + (f", {skipped} without a published version left out" if skipped else "")
        + f"; {target.stat().st_size / 1e6:.1f} MB). Open it in a browser.",
        highlight=False,
    )
