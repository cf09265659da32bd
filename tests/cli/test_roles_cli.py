"""``envhub check`` and ``envhub eval`` on multi-role envs (tic-tac-toe and setter-solver,
registered for the test), eval against a local server speaking the OpenAI chat protocol."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

import envhub
from envhub import registry
from envhub.cli.app import app
from envhub.cli.console import console
from envhub.envs.setter_solver import SetterSolverEnv
from envhub.envs.tictactoe import TicTacToeEnv
from envhub.report.data import build
from envhub.rollout.io import read_trajectories
from envhub.types import Message

runner = CliRunner()


@pytest.fixture(autouse=True)
def multi_role_envs(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(console, "_width", 400)  # one table row per line
    envhub.register("tic-tac-toe", TicTacToeEnv, override=True)
    envhub.register("setter-solver", SetterSolverEnv, override=True)
    envhub.register("xo-vs-perfect", lambda: TicTacToeEnv(opponent="perfect"), override=True)
    yield
    for name in ("tic-tac-toe", "setter-solver", "xo-vs-perfect"):
        registry._registered.pop(name, None)


@pytest.mark.parametrize("env", ["tic-tac-toe", "xo-vs-perfect", "setter-solver"])
def test_check_passes_multi_role_envs(env: str) -> None:
    result = runner.invoke(app, ["check", env])
    assert result.exit_code == 0, result.output
    assert "episodes" in result.output and "fail" not in result.output.lower()


def first_free(messages: list[dict[str, Any]]) -> str:
    """Take the first free cell of the last board shown."""
    board = [line for line in messages[-1]["content"].splitlines() if "|" in line]
    return next(c.strip() for line in board for c in line.split("|") if c.strip().isdigit())


def player(method: str, path: str, body: Any) -> tuple[int, Any]:
    """A chat server that plays the first free cell; no /tokenize, so chat mode."""
    if path == "/v1/models":
        return 200, {"data": [{"id": "first-free"}]}
    if path == "/v1/chat/completions":
        assert all("actor" not in m for m in body["messages"])  # labels never reach a model
        Message.model_validate(body["messages"][0])
        text = first_free(body["messages"])
        return 200, {
            "choices": [
                {"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            ]
        }
    return 404, {"error": {"message": f"no route {path}"}}


def test_eval_of_self_play_records_and_summarises_each_side(http_server, tmp_path) -> None:
    server = http_server(player)
    out = tmp_path / "run"
    result = runner.invoke(
        app, ["eval", "tic-tac-toe", "-u", f"{server.url}/v1", "-n", "2", "-r", "2", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    trajectories = read_trajectories(out / "trajectories.jsonl")
    assert [t.role for t in trajectories] == ["x", "o"] * 4
    summary = json.loads((out / "summary.json").read_text())
    x, o = summary["roles"]["x"], summary["roles"]["o"]
    assert (x["trajectories"], o["trajectories"]) == (4, 4)
    assert x["reward_mean"] == -o["reward_mean"]  # zero-sum
    wins = sum(t.reward == 1.0 for t in trajectories if t.role == "x")
    assert x["results"].get("win", 0) == wins
    rows = {
        cells[1].strip(): cells[2].strip()
        for cells in (line.split("│") for line in result.output.splitlines())
        if len(cells) > 3
    }
    assert rows["role x"].startswith(f"reward {x['reward_mean']:.3f}, 4 trajectories (")
    pass_x = ", ".join(f"pass@{k} {v:.3f}" for k, v in x["pass_at"].items())
    assert list(x["pass_at"]) == ["1", "2"] and rows["role x"].endswith(f"), {pass_x}")
    # Episodes are games (two trajectories each): the table, summary.json and the report agree.
    assert rows["episodes"] == "4 (2 tasks x 2), 8 trajectories"
    assert (summary["episodes"], summary["samples_per_task"], summary["trajectories"]) == (4, 2, 8)
    document, _ = build(out)
    assert document["summary"] == summary
    assert document["steps"] == [{"key": "eval", "label": "eval", "episodes": 4, "trajectories": 8}]
