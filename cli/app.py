"""The ``envhub`` command. Each command lives in its own module and imports what it needs
inside the command, so ``envhub --help`` stays fast and never imports torch or vLLM."""

from __future__ import annotations

import sys

import typer

from envhub.cli import (
    catalog,
    check,
    doctor,
    eval,
    examples,
    init,
    install,
    leaderboard,
    list,
    push,
    report,
    rescore,
    search,
    serve,
    serve_model,
    serve_trainer,
    show,
    train,
)

app = typer.Typer(
    name="envhub",
    help="Write, check, share and train on multi-turn LLM environments.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

for module in (
    init,
    list,
    check,
    eval,
    show,
    rescore,
    report,
    doctor,
    train,
    examples,
    push,
    install,
    search,
    leaderboard,
    catalog,
    serve,
    serve_model,
    serve_trainer,
):
    module.register(app)


def main() -> None:
    """Entry point: envhub errors become one clear line and exit code 1 (``--debug``: traceback)."""
    from envhub.cli.logs import show_envhub_logs
    from envhub.errors import EnvhubError

    debug = "--debug" in sys.argv
    if debug:
        sys.argv.remove("--debug")
    show_envhub_logs()  # engine start progress and warnings, on a terminal or in a log file
    try:
        app()
    except EnvhubError as e:
        if debug:
            raise
        from rich.markup import escape

        from envhub.cli.console import err_console

        # Messages quote other programs' text (paths, gloo's "[/path/pair.cc:537]"): never markup.
        err_console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        raise SystemExit(1) from None
