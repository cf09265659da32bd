"""`envhub serve`'s flags reach the server's settings (the server itself: tests/serve)."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from envhub.cli.app import app

runner = CliRunner()


def test_the_limit_flags_reach_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    served: list[Any] = []
    monkeypatch.setattr("envhub.serve.server.serve", served.append)
    flags = ["--max-depth", "8", "--max-items", "500", "--max-array-bytes", "4096"]
    flags += ["--max-in-flight", "64", "--idle-timeout", "90", "--read-timeout", "5"]
    result = runner.invoke(app, ["serve", "calculator", *flags])
    assert result.exit_code == 0, result.output
    [settings] = served
    assert (settings.max_depth, settings.max_items, settings.max_array_bytes) == (8, 500, 4096)
    assert (settings.max_in_flight, settings.idle_timeout, settings.read_timeout) == (64, 90, 5)


def test_the_defaults_are_the_settings_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    from envhub.serve.server import ServeSettings

    served: list[Any] = []
    monkeypatch.setattr("envhub.serve.server.serve", served.append)
    assert runner.invoke(app, ["serve", "calculator"]).exit_code == 0
    assert served == [ServeSettings(env="calculator")]
