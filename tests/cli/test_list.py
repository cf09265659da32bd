"""``envhub list`` renders the reST markup of docstrings as plain text (a user saw
````pip install openai-agents```` with its backquotes)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from envhub.cli.app import app
from envhub.cli.console import console
from envhub.cli.list import plain_rest

runner = CliRunner()


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        ("Solved by an agent (``pip install openai-agents``).",
         "Solved by an agent (pip install openai-agents)."),
        ("A ``python`` tool, `interpreted` too.", "A python tool, interpreted too."),
        ("By :func:`envhub.make`, an :class:`~envhub.env.Env`.", "By envhub.make, an Env."),
        ("See :ref:`the guide <guide-anchor>`.", "See the guide."),
        ("No markup: 2*3, a`b and it's fine.", "No markup: 2*3, a`b and it's fine."),
    ],
)  # fmt: skip
def test_plain_rest(line: str, shown: str) -> None:
    assert plain_rest(line) == shown


def test_list_shows_no_backquotes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("envhub.adapters.installed_frameworks", list)  # registered envs only
    monkeypatch.setattr(console, "_width", None)  # the shared console keeps the width it read
    result = runner.invoke(app, ["list"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    row = next(line for line in result.stdout.splitlines() if line.startswith("calculator-agent"))
    assert row.rstrip().endswith("Calculator problems solved by an Agents SDK agent "
                                 "(pip install openai-agents).")  # fmt: skip
    assert "`" not in result.stdout
