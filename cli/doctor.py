"""``envhub doctor``: is a model's chat template safe for token-exact multi-turn training?"""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the ``envhub doctor`` command to ``app``."""
    app.command("doctor")(doctor_command)


def doctor_command(
    base_url: str = typer.Option(
        ..., "--base-url", "-u", help="A vLLM server (its /tokenize renders the template)."
    ),
    model: str = typer.Option(
        None, "--model", "-m", help="Model name on the server (default: its first)."
    ),
) -> None:
    """Check that each turn's prompt is a token prefix of the next.

    Renders synthetic plain, tool-calling and reasoning conversations with the
    server's chat template. Exits 1 if the template rewrites history.

    Examples:
        envhub doctor -u http://127.0.0.1:8000
    """
    import asyncio

    from rich.table import Table

    from envhub.cli.console import console
    from envhub.doctor import CONVERSATIONS, check_prefix_property
    from envhub.errors import EngineError
    from envhub.inference.openai_http import OpenAIEngine
    from envhub.rollout.tool_prompt import ToolsInPrompt, template_renders_tools

    async def run():
        engine = OpenAIEngine(base_url, model, mode="tokens")
        try:
            await engine.start()
            renders = await template_renders_tools(engine.tokenizer)
            # Rendered as rollouts render them: tools in the system prompt when the template
            # drops them.
            found = await check_prefix_property(ToolsInPrompt(engine.tokenizer))
            return engine.model, renders, found
        finally:
            await engine.aclose()

    try:
        served, renders_tools, (checked, findings) = asyncio.run(run())
    except EngineError as e:
        raise EngineError(f"{e} (doctor needs a server with /tokenize, such as vLLM)") from None
    table = Table(
        title=f"chat template of {served}: "
        f"{checked} turn boundaries in {len(CONVERSATIONS)} conversations",
        title_justify="left",
    )
    for column in (
        "conversation",
        "turn",
        "first differing token",
        "history as rendered",
        "next prompt as rendered",
    ):
        table.add_column(column)
    console.print(
        "tools: rendered by the chat template"
        if renders_tools
        else "tools: the chat template ignores `tools`; envhub lists them in the system prompt "
        "(format: envhub.tools.prompt)",
        soft_wrap=True,
    )
    for f in findings:
        table.add_row(
            f.conversation, str(f.turn), str(f.position), str(f.expected), str(f.rendered)
        )
    if findings:
        console.print(table)
        console.print(
            "[red]the template rewrites earlier turns:[/] envhub keeps the tokens as sampled "
            "and records drift on each trajectory",
            soft_wrap=True,
        )
        raise typer.Exit(code=1)
    console.print(
        "[green]ok[/]: every turn's prompt is an exact prefix of the next "
        f"({checked} turn boundaries checked)",
        soft_wrap=True,
    )
