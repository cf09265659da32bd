"""``envhub list`` and ``envhub check`` on the built-in envs that gained difficulty levels: they
are listed as before, and each passes every gate of ``check`` (the reward audit included) at
the level its defaults select."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from envhub.cli.app import app
from envhub.cli.console import console

runner = CliRunner()
LEVELLED = ["calculator", "calculator-agent", "frozenlake", "repo-repair", "wordle"]


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    # One table row per line: the shared console keeps the width it read at import.
    monkeypatch.setattr(console, "_width", 400)


def test_list_shows_the_levelled_envs() -> None:
    result = runner.invoke(app, ["list"], env={"NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    names = {line.split()[0] for line in result.stdout.splitlines() if line.strip()}
    assert set(LEVELLED) <= names


@pytest.mark.parametrize("name", ["calculator", "frozenlake", "wordle"])
def test_check_passes_every_gate(name: str) -> None:
    result = runner.invoke(app, ["check", name])
    assert result.exit_code == 0, result.output
    rows = [line.split("│")[1:3] for line in result.output.splitlines() if line.startswith("│")]
    results = {gate.strip(): outcome.strip() for gate, outcome in rows if gate.strip()}
    assert results["reference policy at top"] == "ok" and results["reward audit"] == "ok"
    assert set(results.values()) == {"ok"}, results
