"""`envhub eval` on workspace envs (repo-repair, a Harbor task folder) through a local server
speaking the OpenAI chat protocol, whose answers come from the env's reference policy; `envhub
show` then shows the commands and their outputs."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import envhub
from envhub.cli.app import app
from envhub.rollout.io import read_trajectories
from envhub.sandbox import bwrap_problem
from envhub.types import Message

pytestmark = pytest.mark.skipif(
    bwrap_problem() is not None or os.geteuid() != 0,
    reason="local sessions need bubblewrap and root",
)
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "harbor"
runner = CliRunner()


def solver_for(env_name: str, **env_args: Any):
    policy = envhub.make(env_name, **env_args).reference_policy

    def solver(method: str, path: str, body: Any) -> tuple[int, Any]:
        if path == "/v1/models":
            return 200, {"data": [{"id": "solver"}]}
        messages = [Message.model_validate(m) for m in body["messages"]]
        text = policy(messages, body.get("tools"))
        choice = {"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        return 200, {"choices": [choice]}

    return solver


def evaluate(http_server, tmp_path: Path, env_name: str, *args: str) -> Path:
    server = http_server(
        solver_for(env_name, **{a.split("=")[0]: json.loads(a.split("=")[1]) for a in args})
    )
    out = tmp_path / "run"
    env_args = [x for a in args for x in ("-a", a)]
    result = runner.invoke(
        app,
        [
            "eval",
            env_name,
            "-u",
            f"{server.url}/v1",
            "-n",
            "2",
            "-r",
            "2",
            "-o",
            str(out),
            *env_args,
        ],
    )
    assert result.exit_code == 0, result.output
    assert "pass@2" in result.output
    return out


def test_eval_repo_repair_and_show_the_commands(http_server, tmp_path: Path) -> None:
    out = evaluate(http_server, tmp_path, "repo-repair", "seeds=[0]", "difficulties=[1, 2]")
    trajectories = read_trajectories(out / "trajectories.jsonl")
    assert [t.reward for t in trajectories] == [1.0] * 4
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["reward_mean"], summary["pass_at"]) == (1.0, {"1": 1.0, "2": 1.0})
    shown = runner.invoke(app, ["show", str(out), "-e", "0"])
    assert shown.exit_code == 0
    assert '"name": "create"' in shown.output and "tool -> create" in shown.output
    assert "Wrote " in shown.output and "lines," in shown.output


def test_eval_a_harbor_task_folder(http_server, tmp_path: Path) -> None:
    out = evaluate(http_server, tmp_path, str(EXAMPLES / "hello-file"))
    trajectories = read_trajectories(out / "trajectories.jsonl")
    assert [t.reward for t in trajectories] == [1.0] * 2
    assert [t.info for t in trajectories] == [{"task": "hello-file"}] * 2
    shown = runner.invoke(app, ["show", str(out), "-e", "0"])
    # Labelled with the task's name (its folder's, with no [task] name), not only the env's.
    assert shown.output.startswith("episode 0: hello-file (harbor v0.1.0) task 0 sample 0 |")
    assert "tool -> bash" in shown.output
    assert "solve.sh" in shown.output
    assert "[exit 0]" in shown.output


def test_eval_a_registry_dataset_shows_each_task(http_server, tmp_path: Path) -> None:
    for name in ("hello-file", "fix-median"):
        shutil.copytree(EXAMPLES / name, tmp_path / "tasks" / name)
    registry = tmp_path / "registry.json"
    tasks = [{"name": n, "path": f"tasks/{n}"} for n in ("hello-file", "fix-median")]
    registry.write_text(json.dumps([{"name": "two", "version": "1.0", "tasks": tasks}]))
    solve = solver_for(str(registry))

    def solver(method: str, path: str, body: Any) -> tuple[int, Any]:
        if "hello.txt" in json.dumps((body or {}).get("messages")):  # hello-file: not tried
            return 200, {"choices": [{"message": {"role": "assistant", "content": "Done."},
                                      "finish_reason": "stop"}]}  # fmt: skip
        return solve(method, path, body)

    out = tmp_path / "run"
    url = f"{http_server(solver).url}/v1"
    result = runner.invoke(app, ["eval", str(registry), "-u", url, "-r", "2", "-o", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["pass_at"] == {"1": 0.5, "2": 0.5}
    assert summary["per_task"] == [
        {"task": "hello-file", "task_index": 0, "episodes": 2, "reward_mean": 0.0,
         "pass_at": {"1": 0.0, "2": 0.0}},
        {"task": "fix-median", "task_index": 1, "episodes": 2, "reward_mean": 1.0,
         "pass_at": {"1": 1.0, "2": 1.0}},
    ]  # fmt: skip
    assert "│ hello-file │ 2        │ 0.000  │ 0.000  │ 0.000  │" in result.output
    assert "│ fix-median │ 2        │ 1.000  │ 1.000  │ 1.000  │" in result.output
    shown = runner.invoke(app, ["show", str(out)])
    assert "│ fix-median │ 2        │ 1.000  │ 1.000  │ 1.000  │" in shown.output
