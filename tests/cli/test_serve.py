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


def test_each_settings_option_takes_its_default_from_the_settings_model() -> None:
    """One source: every option that fills a ``ServeSettings`` field is made by ``_setting``
    (which reads the field's default), none writes a default of its own."""
    import ast
    import inspect

    from envhub.cli import serve
    from envhub.serve.settings import ServeSettings

    [function] = ast.parse(inspect.getsource(serve.serve_command)).body
    assert isinstance(function, ast.FunctionDef)
    # Every parameter has a default (the env's is typer.Argument(...)).
    names = [argument.arg for argument in function.args.args]
    defaults = dict(zip(names, function.args.defaults, strict=True))
    settings = ServeSettings.model_fields
    fields = [n for n in defaults if n in settings and not settings[n].is_required()]
    assert len(fields) == 12  # all but env_args (--arg) and threads (no option)
    for name in fields:
        call = defaults[name]
        assert isinstance(call, ast.Call) and ast.unparse(call.func) == "_setting", name
        assert ast.literal_eval(call.args[0]) == name


def test_the_command_line_does_not_import_numpy_for_the_settings() -> None:
    """``envhub``'s start reads the settings model, whose module stays light."""
    import subprocess
    import sys

    probe = "import sys, envhub.cli.app; print(sorted({'numpy', 'starlette'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert (result.returncode, result.stdout) == (0, "[]\n"), result.stderr
