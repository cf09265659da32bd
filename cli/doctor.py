"""``envhub doctor``: is a model's chat template safe for token-exact multi-turn training?"""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the ``envhub doctor`` command to ``app``."""
    app.command("doctor")(doctor_command)


def doctor_command(
    base_url: str = typer.Option(
        ...,
        "--base-url",
        "-u",
        help="A vLLM server (its /tokenize renders the template); `envhub serve-model` starts one.",
    ),
    model: str = typer.Option(
        None, "--model", "-m", help="Model name on the server (default: its first)."
    ),
) -> None:
    """Check that each turn's prompt is a token prefix of the next.

    Renders synthetic plain, tool-calling and reasoning conversations with the
    server's chat template. Exits 1 if the template rewrites history.

    No server yet? `envhub serve-model` starts one and prints this line.

    Examples:
        envhub doctor -u http://127.0.0.1:8000
    """
    import asyncio

    from envhub.checks.doctor import CONVERSATIONS, check_prefix_property
    from envhub.errors import EngineError, EngineUnavailableError
    from envhub.inference.openai_http import OpenAIEngine
    from envhub.rollout.tool_prompt import template_renders_tools

    async def run():
        engine = OpenAIEngine(base_url, model, mode="tokens")
        try:
            await engine.start()
            renders = await template_renders_tools(engine.tokenizer)
            return engine.model, renders, await check_prefix_property(engine.tokenizer)
        finally:
            await engine.aclose()

    try:
        served, renders_tools, (checked, findings) = asyncio.run(run())
    except EngineUnavailableError:
        raise EngineUnavailableError(
            f"no server answers at {base_url} — start one with `envhub serve-model [MODEL]` "
            "(SmolLM2-135M-Instruct by default, installed by the set-up): it prints the "
            "`envhub doctor -u` line to run"
        ) from None
    except EngineError as e:
        raise EngineError(f"{e} (doctor needs a server with /tokenize, such as vLLM)") from None
    subject = f"chat template of {served} on {len(CONVERSATIONS)} conversations"
    if not report_prefix_findings(subject, renders_tools, checked, findings):
        raise typer.Exit(code=1)


def report_prefix_findings(subject: str, renders_tools: bool, checked: int, findings: list) -> bool:
    """Print where the tools go and every place a turn's prompt is not a prefix of the next
    (tokens on both sides, decoded when the tokenizer can); True when there is none. Shared by
    ``envhub doctor`` and ``envhub check --model``."""
    from rich.markup import escape
    from rich.table import Table

    from envhub.cli.console import console

    console.print(
        "tools: rendered by the chat template"
        if renders_tools
        else "tools: the chat template ignores `tools`; envhub lists them in the system prompt "
        "(format: envhub.tools.prompt)",
        soft_wrap=True,
    )
    if not findings:
        console.print(
            f"[green]ok[/], {escape(subject)}: every turn's prompt is an exact prefix of the "
            f"next ({checked} turn boundaries checked)",
            soft_wrap=True,
        )
        return True
    table = Table(title=f"{subject}: {checked} turn boundaries checked", title_justify="left")
    for column in ("conversation", "turn", "token", "history as rendered", "next prompt"):
        table.add_column(column, overflow="fold")
    for f in findings:
        before = f.expected_text if f.expected_text is not None else str(f.expected)
        after = f.rendered_text if f.rendered_text is not None else str(f.rendered)
        table.add_row(f.conversation, str(f.turn), str(f.position), escape(repr(before)),
                      escape(repr(after)))  # fmt: skip
    console.print(table)
    console.print(
        "[red]the template rewrites earlier turns:[/] envhub keeps the tokens as sampled "
        "and records drift on each trajectory",
        soft_wrap=True,
    )
    return False
