"""What the CLI prints on an 80-column terminal: tables keep names whole and help reads whole.

Each test reproduces what a user saw at ``COLUMNS=80`` (``guess-numbe r`` in ``envhub list``, a
``st…`` header over the training table, the default model cut to ``HuggingFaceTB/SmolLM2-135M-I…``
in ``eval --help``, help sentences broken into two-word lines) and checks what prints instead.
"""

from __future__ import annotations

import inspect
import io
import sys
import textwrap
from itertools import takewhile

import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from envhub.cli.app import app
from envhub.cli.console import console
from envhub.cli.eval import DEFAULT_MODEL
from envhub.cli.list import describe
from envhub.hub.search import HubPackage
from envhub.multiturn import ToolEnv
from envhub.registry import EnvSpec, _registered, list_envs
from envhub.tools.tool import tool

WIDTH = 80
COMMANDS = sorted(typer.main.get_command(app).commands)
runner = CliRunner()


@tool
def lookup_capital(country: str) -> str:
    """The capital of ``country``."""
    return country


@tool
def list_countries() -> str:
    """Every country in the atlas."""
    return ""


class CapitalCitiesEnv(ToolEnv):
    """Name the capital of a country; a lookup tool reads a hidden atlas."""

    version = "0.3.1"
    tools = (lookup_capital, list_countries)


@pytest.fixture
def installed_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """An env from an installed Hub package, with longer names than the built-ins have: the
    extra width is what squeezed the table until names split."""
    spec = EnvSpec("capital-cities", CapitalCitiesEnv, "envhub-capital-cities", "0.3.1")
    monkeypatch.setitem(_registered, "capital-cities", spec)
    # Only registered envs: adapted ones (gem:..., verifiers:...) depend on what is installed.
    monkeypatch.setattr("envhub.adapters.installed_frameworks", list)


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch):
    """Run a command as on a terminal ``width`` columns wide; returns its stdout lines (rich pads
    them to the width with spaces: those are left off)."""

    def run(*args: str, width: int = WIDTH) -> list[str]:
        # The shared console keeps a width it read from COLUMNS at import: forget it.
        monkeypatch.setattr(console, "_width", None)
        result = runner.invoke(app, list(args), env={"COLUMNS": str(width), "NO_COLOR": "1"})
        assert result.exit_code == 0, result.output
        return [line.rstrip() for line in result.stdout.splitlines()]

    return run


def _help(command: str) -> str:
    """The command's docstring as typer reads it."""
    return inspect.cleandoc(typer.main.get_command(app).commands[command].help or "")


def test_list_keeps_names_whole_and_puts_descriptions_under_them_at_80_columns(
    terminal, installed_package
) -> None:
    lines = terminal("list")
    assert max(len(line) for line in lines) <= WIDTH
    # Each env starts a line with its whole name, then its description (and tools) under it.
    starts = [line.split()[0] for line in lines if not line.startswith(" ")]
    assert starts == ["envhub", "name", *sorted(list_envs())]
    assert lines[1] == "name              kind         version  from"
    assert "guess-number      multi-turn   0.1.0    envhub" in lines
    at = lines.index("capital-cities    tool         0.3.1    envhub-capital-cities")
    assert lines[at + 1 : at + 3] == [
        "    Name the capital of a country; a lookup tool reads a hidden atlas.",
        "    tools: lookup_capital, list_countries",
    ]
    for name, spec in list_envs().items():
        at = next(i for i, line in enumerate(lines) if line.split()[0] == name)
        under = " ".join(
            line.strip() for line in takewhile(lambda line: line.startswith(" "), lines[at + 1 :])
        )
        assert under.startswith(describe(spec)[4]), name


def test_list_is_one_table_row_per_env_on_a_wide_terminal(terminal, installed_package) -> None:
    lines = terminal("list", width=200)
    assert lines[1].split() == ["name", "kind", "tools", "version", "from", "description"]
    rows = {line.split()[0]: line for line in lines[2:]}
    assert list(rows) == sorted(list_envs())
    assert rows["calculator"].split() == [
        "calculator", "tool", "calculate", "0.1.0", "envhub",
        "Multi-turn", "arithmetic", "with", "a", "calculator", "tool.",
    ]  # fmt: skip
    assert rows["capital-cities"] == (
        "capital-cities    tool         lookup_capital, list_countries   0.3.1    "
        "envhub-capital-cities  Name the capital of a country; a lookup tool reads a hidden atlas."
    )
    assert max(len(line) for line in lines) <= 200


def test_hub_listing_keeps_repo_ids_whole_at_80_columns(
    terminal, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = [
        HubPackage("someone-with-a-long-name/capital-cities-of-the-world", ["envhub", "tool"],
                   "2026-01-15T10:00:00", False),
        HubPackage("my-org/wordle-in-seven-languages", ["envhub", "multi-turn", "games"],
                   "2026-02-01T08:30:00", True),
    ]  # fmt: skip
    monkeypatch.setattr(sys.modules["envhub.hub.search"], "search", lambda *a, **kw: found)
    assert terminal("list", "--hub") == [
        "envhub packages on the Hub",
        "repo                                                  updated     visibility",
        "someone-with-a-long-name/capital-cities-of-the-world  2026-01-15  public",
        "    tags: tool",
        "my-org/wordle-in-seven-languages                      2026-02-01  private",
        "    tags: multi-turn, games",
    ]
    assert terminal("search", "wordle", width=120)[1:] == [
        "repo                                                  updated     visibility  tags",
        "someone-with-a-long-name/capital-cities-of-the-world  2026-01-15  public      tool",
        "my-org/wordle-in-seven-languages                      2026-02-01  private     "
        "multi-turn, games",
    ]


def test_the_training_table_header_keeps_its_first_label_for_a_short_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from envhub.cli import train_view

    screen = Console(width=WIDTH, force_terminal=True, record=True, file=io.StringIO())
    monkeypatch.setattr(train_view, "console", screen)
    reporter = train_view.RichReporter()
    reporter.steps = 5  # `envhub train examples/quickstart.yaml steps=5`
    metrics = {
        "reward/mean": 0.4375, "reward/std": 0.31, "pass@1": 0.44,
        "rollout/completion_tokens": 2113, "batch/kept": 24, "train/loss": -0.0123,
        "train/kl": 0.0012, "train/entropy": 1.234, "train/clip_frac": 0.012,
        "train/mismatch_kl": 3.2e-4, "train/grad_norm": 0.87,
        "throughput/rollout_tokens_per_s": 1523, "time/rollout": 12.3, "time/update": 4.5,
        "time/sync": 0.42, "time/step": 17.4,
    }  # fmt: skip
    reporter.step(3, metrics)
    assert screen.export_text().splitlines() == [
        "step reward pass@1 tokens kept    loss entropy gen tok/s gen s train s step s",
        " 3/5  0.438   0.44   2113   24 -0.0123   1.234      1523  12.3     4.5   17.4",
    ]


def test_eval_help_shows_the_default_model_whole(terminal) -> None:
    lines = terminal("eval", "--help")
    assert any(DEFAULT_MODEL in line for line in lines)


@pytest.mark.parametrize("command", COMMANDS)
def test_help_fits_80_columns_and_cuts_nothing(terminal, command: str) -> None:
    lines = terminal(command, "--help")
    assert max(len(line) for line in lines) <= WIDTH
    assert not [line for line in lines if "…" in line]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_each_line_of_the_docstring_whole(terminal, command: str) -> None:
    """Past the first paragraph, typer keeps the docstring's line breaks and rich wraps lines
    longer than the terminal: an 88-character line printed as 78 characters and then one word."""
    later = [
        line.strip() for line in _help(command).split("\n\n", 1)[-1].splitlines() if line.strip()
    ]
    shown = {line.strip() for line in terminal(command, "--help")}
    assert [line for line in later if line not in shown] == []


def test_the_command_list_wraps_each_summary_only_where_the_terminal_ends(terminal) -> None:
    """A summary (a docstring's first paragraph) with a line break in it printed its first line,
    a fragment (`on synthetic`), then the rest."""
    lines = terminal("--help")
    top = next(i for i, line in enumerate(lines) if line.startswith("╭─ Commands"))
    panel = lines[top + 1 : lines.index("╰" + "─" * (WIDTH - 2) + "╯", top)]
    start = panel[0].index(panel[0].split()[2])  # "│", the command, then its summary
    width = len(panel[0]) - start - 2  # up to " │"
    summaries: dict[str, list[str]] = {}
    for line in panel:
        name = line[1:start].strip() or list(summaries)[-1]  # a blank name continues a row
        summaries.setdefault(name, []).append(line[start:-2].rstrip())
    for name, shown in summaries.items():
        summary = " ".join(_help(name).split("\n\n")[0].split())
        wrapped = textwrap.wrap(summary, width, break_long_words=False, break_on_hyphens=False)
        assert shown == wrapped, name


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_every_option_help_in_full(terminal, command: str) -> None:
    """Help is rich markup: ``owner/name[@version|@revision]`` printed as ``owner/name``."""
    shown = [" ".join(line.strip("│ ").split()) for line in terminal(command, "--help", width=300)]
    for param in typer.main.get_command(app).commands[command].params:
        if param.help:
            text = " ".join(param.help.split())
            assert any(text in line for line in shown), (param.name, text)


def test_the_training_header_says_where_the_tools_went(monkeypatch: pytest.MonkeyPatch) -> None:
    from envhub import examples
    from envhub.cli import train_view
    from envhub.trainer.config import load_config

    screen = Console(width=WIDTH, force_terminal=True, record=True, file=io.StringIO())
    monkeypatch.setattr(train_view, "console", screen)
    config = load_config(examples.path("quickstart"), ["envs.0.name=calculator", "envs.0.args={}"])
    tools = "1 tool(s) in the system prompt: the chat template ignores `tools` (format: ...)"
    info = {"run_dir": "outputs/run", "parameters": 134.5e6, "device": "cpu", "tools": tools}
    train_view.RichReporter().start(config, info)
    assert f"tools: {tools}" in screen.export_text().replace("\n", " ")


def test_a_run_with_held_out_eval_gets_an_eval_column(monkeypatch: pytest.MonkeyPatch) -> None:
    from envhub.cli import train_view

    screen = Console(width=WIDTH, force_terminal=True, record=True, file=io.StringIO())
    monkeypatch.setattr(train_view, "console", screen)
    reporter = train_view.RichReporter()
    reporter.steps, reporter.evaluates = 20, True
    reporter.step(0, {"eval/reward": 0.03125, "eval/two-digit/reward": 0.03125})
    reporter.step(1, {"reward/mean": 0.21875, "pass@1": 0.22, "time/step": 16.3})
    lines = screen.export_text().splitlines()
    assert lines[0].split()[:5] == ["step", "reward", "pass@1", "eval", "tokens"]
    assert lines[1].split()[:5] == ["0/20", "-", "-", "0.031", "-"]
    assert lines[2].split()[:5] == ["1/20", "0.219", "0.22", "-", "-"]
    assert all(len(line) <= WIDTH for line in lines)
