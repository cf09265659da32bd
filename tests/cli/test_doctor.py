"""``envhub doctor`` without a server: the error names the command that starts one."""

from __future__ import annotations

from typer.testing import CliRunner

from envhub.cli.app import app
from envhub.defaults import free_port
from envhub.errors import EngineUnavailableError


def test_no_server_names_serve_model() -> None:
    port = free_port()  # a port nobody listens on once closed
    result = CliRunner().invoke(app, ["doctor", "-u", f"http://127.0.0.1:{port}"])
    assert isinstance(result.exception, EngineUnavailableError)
    assert str(result.exception) == (
        f"no server answers at http://127.0.0.1:{port} — start one with `envhub serve-model "
        "[MODEL]` (SmolLM2-135M-Instruct by default, installed by the set-up): it prints the "
        "`envhub doctor -u` line to run"
    )
