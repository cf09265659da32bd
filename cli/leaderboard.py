"""``envhub leaderboard``: an env package's Hub results, one version at a time; and the push of
an eval's result that ``envhub eval --push`` makes."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    """Add the ``envhub leaderboard`` command to ``app``."""
    app.command("leaderboard")(leaderboard_command)


def leaderboard_command(
    repo: str = typer.Argument(..., help="The env package's Hub repo, owner/name."),
    version: str = typer.Option(
        None, "--version", help="The env version (default: the highest with results)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the leaderboard as JSON."),
    token: str = typer.Option(
        None, "--token", envvar="HF_TOKEN", help="Hub token (for private repos)."
    ),
) -> None:
    """Rank the results pushed with `envhub eval --push`, best mean reward first.

    A leaderboard is of one env version: results of other versions are
    listed, never ranked with it. Results in unmerged pull requests do not
    count yet.

    Examples:
        envhub leaderboard alice/capital-cities
        envhub leaderboard alice/capital-cities --version 0.1.0 --json
    """
    from envhub.cli.console import console
    from envhub.hub.client import parse_ref
    from envhub.hub.leaderboard import board, others_line
    from envhub.hub.results import read_results

    repo_id = parse_ref(repo).repo_id
    data = board(repo_id, read_results(repo_id, token=token), version)
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    console.print(_table(data))
    if others_line(data):
        console.print(others_line(data), highlight=False)


def _table(data: dict):
    """The leaderboard as a rich table."""
    from rich.table import Table

    from envhub.hub.leaderboard import COLUMNS, cells

    title = f"{data['repo']} {data['version'] or '(no results)'}"
    table = Table(title=title, title_justify="left")
    for column in COLUMNS:
        table.add_column(column, overflow="fold")
    for row in data["rows"]:
        table.add_row(*cells(row))
    return table


def push_eval(
    folder: Path,
    env: str,
    *,
    repo: str | None,
    pushed_by: str,
    by: str | None,
    model_revision: str | None,
    token: str | None,
    trajectories: bool = False,
) -> None:
    """Push the result of the eval saved in ``folder`` (of ``env``) to the env's Hub repo, with
    its ``trajectories`` first, as a dataset the result links to, when asked."""
    from envhub.cli.console import console
    from envhub.errors import ConfigError
    from envhub.hub.result_push import push_result
    from envhub.hub.results import build_result, repo_of

    config = json.loads((folder / "config.json").read_text())
    commit = next((r.get("commit") for r in config.get("env_refs", [])), None)
    repo_id = repo or repo_of(env, commit)
    if repo_id is None:
        raise ConfigError(
            f"{env}'s Hub repo is unknown (it was not installed from the Hub); "
            "give it with --push-repo OWNER/NAME"
        )
    result = build_result(folder, repo_id=repo_id, pushed_by=pushed_by, by=by,
                          model_revision=model_revision)  # fmt: skip
    if trajectories:
        from envhub.hub.trajectories import push_trajectories

        ref = push_trajectories(folder, result, token=token)
        result = result.model_copy(update={"trajectories": ref})
        console.print(f"trajectories pushed to dataset {ref.repo}: {ref.path} "
                      f"({ref.rows} episodes)", highlight=False, soft_wrap=True)  # fmt: skip
    (folder / "hub_result.json").write_text(result.to_json())
    pushed = push_result(result, token=token)
    where = f"pull request {pushed.pull_request}" if pushed.pull_request else "main"
    console.print(f"result pushed to {repo_id} ({where}): {pushed.path}", highlight=False,
                  soft_wrap=True)  # fmt: skip
    if pushed.pull_request:
        console.print("it counts on the leaderboard once the repo's owner merges it",
                      highlight=False)  # fmt: skip
