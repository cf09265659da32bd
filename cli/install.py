"""``envhub install`` and ``envhub pull``: env packages from the Hub, pinned to a commit."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    """Add the ``envhub install`` and ``envhub pull`` commands to ``app``."""
    app.command("install")(install_command)
    app.command("pull")(pull_command)


def install_command(
    reference: str = typer.Argument(
        None, help="owner/name, optionally @version or @revision; none: the whole lock file."
    ),
    trust: bool = typer.Option(
        False, "--trust", help="Install without asking (the package's code will run)."
    ),
    lock: Path = typer.Option(
        Path("envhub.lock"), "--lock", help="Lock file to record the pin in, or to install from."
    ),
    offline: bool = typer.Option(
        False, "--offline", help="pip uses only what is installed (no index, no build isolation)."
    ),
    python: str = typer.Option(
        None, "--python", help="Interpreter to install for (default: this one)."
    ),
    token: str = typer.Option(
        None, "--token", envvar="HF_TOKEN", help="Hub token (private repos)."
    ),
    allow_changes: bool = typer.Option(
        False,
        "--allow-changes",
        help="Install even if its dependencies upgrade, downgrade or reinstall installed "
        "distributions (they are listed).",
    ),
) -> None:
    """Install an env package from the Hub, pinned to a commit.

    Resolves the exact commit, downloads it, verifies the hashes, installs it
    and pins it in envhub.lock. It is refused if it would shadow an installed
    distribution or module, or another project on pip's package indexes (an
    index it cannot reach is named and blocks nothing), or if pip would change
    installed distributions to satisfy its dependencies (unless
    --allow-changes).

    Examples:
        envhub install someone/capital-cities@0.1.0
        envhub install someone/capital-cities --trust
        envhub install someone/capital-cities --trust --allow-changes
        envhub install    # everything envhub.lock pins, at the locked commits
    """
    import sys

    from envhub.cli.console import console, err_console
    from envhub.hub.install import install, install_locked

    def confirm(plan: str) -> bool:
        if not sys.stdin.isatty():
            return False  # nobody to ask; the error shows the plan and says to pass --trust
        console.print(plan, highlight=False, soft_wrap=True)
        return typer.confirm("Install it?", default=False)

    kwargs = {
        "trust": trust,
        "confirm": confirm,
        "python": python,
        "offline": offline,
        "token": token,
        "allow_changes": allow_changes,
    }
    results = (
        [install(reference, lock_file=lock, **kwargs)]
        if reference
        else install_locked(lock, **kwargs)
    )
    for result in results:
        e = result.entry
        for note in result.notes:
            err_console.print(f"note: {note}", highlight=False, soft_wrap=True)
        for change in result.changes:
            console.print(f"changed {change}", highlight=False, soft_wrap=True)
        state = "already installed" if result.skipped_pip else "installed"
        console.print(
            f"{e.repo_id} {e.version} {state}: commit {e.commit}, envs {', '.join(result.envs)}",
            highlight=False,
            soft_wrap=True,
        )
    if reference:
        console.print(f"pinned in {lock}", highlight=False)


def pull_command(
    reference: str = typer.Argument(..., help="owner/name, optionally @version or @revision."),
    show_versions: bool = typer.Option(
        False, "--list", help="List the published versions instead."
    ),
    token: str = typer.Option(
        None, "--token", envvar="HF_TOKEN", help="Hub token (private repos)."
    ),
) -> None:
    """Download and verify a package without installing it.

    Prints what was downloaded and the folder it is in.

    Examples:
        envhub pull someone/capital-cities@0.1.0
        envhub pull someone/capital-cities --list
    """
    from envhub.cli.console import console
    from envhub.hub.client import parse_ref
    from envhub.hub.install import list_versions, pull

    if show_versions:
        for version, commit in sorted(list_versions(parse_ref(reference).repo_id, token).items()):
            console.print(f"{version}  {commit}", highlight=False)
        return
    pulled = pull(reference, token=token)
    console.print(pulled.plan(), highlight=False, soft_wrap=True)
    console.print(str(pulled.folder), highlight=False, soft_wrap=True)
