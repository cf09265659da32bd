"""``envhub push``: check an env package and publish a version of it on the Hub."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    """Add the ``envhub push`` command to ``app``."""
    app.command("push")(push_command)


def push_command(
    path: Path = typer.Argument(
        Path("."), help="The env package folder, or a Harbor task folder (or folder of them)."
    ),
    repo: str = typer.Option(
        None, "--repo", help="owner/name on the Hub (default: your user / the package name)."
    ),
    private: bool = typer.Option(False, "--private", help="Create the repo private."),
    version: str = typer.Option(
        None,
        "--version",
        help="Version to publish; must equal pyproject.toml's (the default). "
        "A Harbor folder has none: 0.1.0 unless given.",
    ),
    token: str = typer.Option(
        None, "--token", envvar="HF_TOKEN", help="Hub token with write access."
    ),
    skip_check: bool = typer.Option(
        False, "--skip-check", help="Push without running the gates (the card says so)."
    ),
    skip_tests: bool = typer.Option(
        False, "--skip-tests", help="Run the gates but not the package's own tests."
    ),
) -> None:
    """Check a package, upload it, tag the version and record its hash.

    A package named like an installed distribution, or like another
    project on pip's package indexes, is refused with what to rename.

    Secrets and junk (.env, keys, tokens, .git, venvs, caches, build output)
    are never uploaded; what was left out is listed.

    A Harbor task folder (or a folder of them) is packaged as it is pushed:
    one env named after the repo, gated by its tasks' solution check.

    Examples:
        envhub push ./my-env
        envhub push ./my-env --repo my-org/my-env --private
        envhub push ./harbor-tasks --repo my-org/tasks --version 0.2.0
    """
    from envhub.cli.console import console, err_console
    from envhub.hub.push import push

    with err_console.status("checking and pushing"):
        result = push(
            path,
            repo,
            private=private,
            version=version,
            token=token,
            check=not skip_check,
            run_tests=not skip_tests,
        )
    for note in result.notes:
        err_console.print(f"note: {note}", highlight=False, soft_wrap=True)
    for name, reason in result.skipped:
        console.print(f"[yellow]skipped[/] {name}: {reason}", highlight=False, soft_wrap=True)
    verb = {
        "published": "published",
        "tagged": "tagged (commit was already there)",
        "unchanged": "already published, same content",
    }[result.status]
    console.print(
        f"{result.repo_id}@{result.version} {verb}: commit {result.commit}, "
        f"{len(result.uploaded)} files, {result.content_hash}",
        highlight=False,
        soft_wrap=True,
    )
    console.print(
        f"install: envhub install {result.repo_id}@{result.version} --trust",
        highlight=False,
        soft_wrap=True,
    )
