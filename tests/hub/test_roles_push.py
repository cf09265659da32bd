"""``envhub push`` of a package whose env has several roles: the push gates (the env contract
played through each actor's view, the reward audit, performance) pass, and it is published."""

from __future__ import annotations

from pathlib import Path

from conftest import ALICE
from hub_server import HubServer
from typer.testing import CliRunner

from envhub.cli.app import app
from envhub.scaffold import create_package

runner = CliRunner()

ENV = '''"""Tic-tac-toe, packaged: a multi-role env (the policy plays both sides)."""

from envhub.envs.tictactoe import TicTacToeEnv


class XoGameEnv(TicTacToeEnv):
    """Tic-tac-toe between X and O."""

    name = "xo-game"
    version = "0.1.0"
'''


def test_a_multi_role_package_passes_the_gates_and_is_published(
    hub: HubServer, tmp_path: Path, unload: list[str]
) -> None:
    unload.append("xo_game")
    package = create_package("xo-game", directory=tmp_path / "src")
    (package / "xo_game" / "env.py").write_text(ENV)
    for test in (package / "tests").glob("test_*.py"):
        test.unlink()
    pushed = runner.invoke(app, ["push", str(package), "--token", ALICE, "--skip-tests"])
    assert pushed.exit_code == 0, pushed.output
    assert hub.repos[("model", "alice/xo-game")].tags["0.1.0"]
    assert "alice/xo-game@0.1.0 published" in pushed.output
