"""``envhub check``: run the env contract checks on a package folder or an installed env."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    """Add the ``envhub check`` command to ``app``."""
    app.command("check")(check_command)


def check_command(
    target: str = typer.Argument(
        ..., help="An env package folder, or the name of an installed env."
    ),
    seeds: int = typer.Option(3, help="Seeds to check each env with."),
    tests: bool = typer.Option(
        True, "--tests/--no-tests", help="Also run a package folder's own tests."
    ),
) -> None:
    """Check that envs honour the env contract.

    The contract: determinism, schemas, rewards, budgets and close.

    A package folder also passes the push gates (what `envhub push` runs and
    puts on the Hub card): metadata, entry points, version, no answer leak in
    prompts, and its own tests.

    Examples:
        envhub check ./my-env
        envhub check calculator
    """
    if Path(target).is_dir():
        _check_package(Path(target), seeds, tests)
        return
    from rich.table import Table

    from envhub.checker import check_env
    from envhub.cli.console import console
    from envhub.loader import get_spec
    from envhub.package import package_env_specs

    specs = package_env_specs(target) if Path(target).is_dir() else {target: get_spec(target)}
    failed = 0
    for name, spec in specs.items():
        report = check_env(
            _construct(name, spec), seeds=tuple(range(seeds)), raise_on_failure=False
        )
        table = Table(
            title=f"{name}: {'[green]passed' if report.passed else '[red]FAILED'}",
            title_justify="left",
        )
        table.add_column("check")
        table.add_column("result")
        table.add_column("detail", overflow="fold")
        for r in report.results:
            table.add_row(r.name, "[green]ok[/]" if r.passed else "[red]fail[/]", r.detail)
        console.print(table)
        failed += not report.passed
    if failed:
        raise typer.Exit(code=1)


def _construct(name: str, spec):
    from envhub.errors import EnvhubError, EnvLoadError

    factory = spec.load()
    try:
        return factory()
    except EnvhubError as e:  # envhub named the cause (a dataset row, say): show it as is
        raise EnvLoadError(f"env {name!r} cannot be constructed: {e}") from e
    except Exception as e:
        raise EnvLoadError(
            f"env {name!r} cannot be constructed without arguments: {type(e).__name__}: {e}"
        ) from e


def _check_package(path: Path, seeds: int, tests: bool) -> None:
    from rich.table import Table

    from envhub.cli.console import console
    from envhub.package_check import check_package

    report = check_package(path, seeds=seeds, run_tests=tests)
    table = Table(
        title=f"{report.name}: {'[green]passed' if report.passed else '[red]FAILED'}[/]"
        f" (version {report.version})",
        title_justify="left",
    )
    for column in ("gate", "result", "detail"):
        table.add_column(column, overflow="fold")
    for r in report.results:
        table.add_row(r.name, "[green]ok[/]" if r.passed else "[red]fail[/]", r.detail)
    console.print(table)
    if not report.passed:
        raise typer.Exit(code=1)
