"""`envhub eval` and `envhub show` through the CLI, against a local server speaking the OpenAI
chat protocol whose answers come from the calculator's reference policy (so rewards are exact).
The same command against real vLLM is tested in tests/e2e."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from envhub.cli.app import app
from envhub.cli.eval import choose_tasks, parse_env_args
from envhub.envs.calculator import CalculatorEnv, reference_policy
from envhub.errors import ConfigError, EnvNotFoundError
from envhub.rollout.io import read_trajectories
from envhub.types import Message

runner = CliRunner()


def solver(method: str, path: str, body: Any) -> tuple[int, Any]:
    """A chat server that answers like the reference policy; no /tokenize, so chat mode."""
    if path == "/v1/models":
        return 200, {"data": [{"id": "solver"}]}
    if path == "/v1/chat/completions":
        messages = [Message.model_validate(m) for m in body["messages"]]
        text = reference_policy(messages, body.get("tools"))
        return 200, {
            "choices": [
                {"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            ]
        }
    return 404, {"error": {"message": f"no route {path}"}}


def test_eval_then_show(http_server, tmp_path):
    server = http_server(solver)
    out = tmp_path / "run"
    result = runner.invoke(
        app,
        [
            "eval",
            "calculator",
            "-u",
            f"{server.url}/v1",
            "-n",
            "3",
            "-r",
            "2",
            "-o",
            str(out),
            "-a",
            "num_tasks=50",
        ],
    )
    assert result.exit_code == 0, result.output
    # The evaluation guide names these files (it once said results.jsonl).
    guide = (Path(__file__).parents[2] / "docs" / "guides" / "evaluation.md").read_text()
    intro = " ".join(guide.split("\n\n")[1].split())
    named = {f for f in ("trajectories.jsonl", "summary.json", "config.json") if f"`{f}`" in intro}
    written = {p.name for p in out.iterdir()}
    assert written == named == {"trajectories.jsonl", "summary.json", "config.json"}
    trajectories = read_trajectories(out / "trajectories.jsonl")
    assert len(trajectories) == 6 and all(
        t.reward == 1.0 and len(t.turns) == 2 for t in trajectories
    )
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["reward_mean"], summary["pass_at"], summary["tool_validity"]) == (
        1.0,
        {"1": 1.0, "2": 1.0},
        1.0,
    )
    config = json.loads((out / "config.json").read_text())
    assert (config["model"], config["mode"], config["env_args"]) == (
        "solver",
        "chat",
        {"num_tasks": 50},
    )
    assert config["tasks"] == choose_tasks(CalculatorEnv(num_tasks=50), 3, 0)
    assert "pass@2" in result.output and "1.000" in result.output

    shown = runner.invoke(app, ["show", str(out)])
    assert shown.exit_code == 0 and "6 (3 tasks x 2)" in shown.output
    assert "episodes/s" in shown.output  # the saved summary knows how long the eval took
    # a bare trajectories file (what `envhub train` saves per step) has no timing to show
    bare = tmp_path / "step-000001.jsonl"
    bare.write_text((out / "trajectories.jsonl").read_text())
    shown_bare = runner.invoke(app, ["show", str(bare)])
    assert (
        shown_bare.exit_code == 0
        and "6 (3 tasks x 2)" in shown_bare.output
        and "episodes/s" not in shown_bare.output
    )
    episode = runner.invoke(app, ["show", str(out), "-e", "0"])
    assert episode.exit_code == 0
    assert f"task {trajectories[0].task_index}" in episode.output and "calculate" in episode.output
    assert runner.invoke(app, ["show", str(out), "-e", "6"]).exit_code != 0


def test_eval_needs_a_server_or_serve():
    result = runner.invoke(app, ["eval", "calculator"])
    assert isinstance(result.exception, ConfigError) and "--base-url" in str(result.exception)


def test_eval_serve_finds_a_misspelled_env_before_anything_else(tmp_path):
    # What a user saw: `--serve` started vLLM (about 30 s) before the typo was found. The model
    # here does not exist either: the env is checked first, and both before any server starts.
    result = runner.invoke(app, ["eval", "calculatr", "--serve", "-m", str(tmp_path / "none")])
    assert isinstance(result.exception, EnvNotFoundError)
    assert "Did you mean 'calculator', 'calculator-agent'?" in str(result.exception)
    bad_arg = runner.invoke(app, ["eval", "calculator", "--serve", "-a", "num_taks=3"])
    assert "unexpected keyword argument 'num_taks'" in str(bad_arg.exception)


def test_eval_serve_checks_the_model_before_starting_vllm(tmp_path):
    result = runner.invoke(app, ["eval", "calculator", "--serve", "-m", str(tmp_path / "none")])
    assert isinstance(result.exception, ConfigError)
    assert str(result.exception).startswith(f"model '{tmp_path / 'none'}' does not exist — give ")
    (tmp_path / "empty").mkdir()
    result = runner.invoke(app, ["eval", "calculator", "--serve", "-m", str(tmp_path / "empty")])
    assert str(result.exception).startswith(f"model folder {tmp_path / 'empty'} has no config.json")


def test_eval_says_where_the_tools_go_in_chat_mode(http_server, tmp_path):
    server = http_server(solver)
    result = runner.invoke(
        app, ["eval", "calculator", "-u", f"{server.url}/v1", "-n", "1", "-r", "1",
              "-o", str(tmp_path / "run")],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "tools: 1 tool(s), sent to the server as `tools` (chat mode)" in result.output


def test_tool_validity_rows_agree_when_most_episodes_make_no_call(http_server, tmp_path):
    # What a user saw: "tool_validity 0.900" (the reward component: an episode without calls
    # scores 1.0) beside "tool-call validity 0.0%" (pooled over calls). Here the first request
    # calls a tool the env lacks and every other one answers at once.
    first = threading.Lock()
    said = []

    def one_bad_call(method: str, path: str, body: Any) -> tuple[int, Any]:
        if path != "/v1/chat/completions":
            return solver(method, path, body)
        with first:
            text = (
                "\\boxed{0}" if said else '<tool_call>{"name": "calc", "arguments": {}}</tool_call>'
            )
            said.append(text)
        message = {"role": "assistant", "content": text}
        return 200, {"choices": [{"message": message, "finish_reason": "stop"}]}

    server = http_server(one_bad_call)
    out = tmp_path / "run"
    result = runner.invoke(
        app, ["eval", "calculator", "-u", f"{server.url}/v1", "-n", "3", "-r", "1", "-o", str(out)],
        terminal_width=200,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = {
        cells[0]: cells[1]
        for line in result.output.splitlines()
        if len(cells := [c.strip() for c in line.strip("│ ").split("│")]) == 2
    }
    assert rows["tool_validity"].startswith("0.667 (mean per episode")  # (0 + 1 + 1) / 3
    assert rows["tool calls / episode"] == "0.33 (1 in 1 of 3 episodes)"
    assert rows["valid tool calls"] == "0 of 1 (0.0%)"
    assert rows["unknown_tool"] == "1"
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["tool_validity"], summary["tool_calls_total"]) == (0.0, 1)


def test_parse_env_args():
    assert parse_env_args(["k=1", "name=easy", "flag=true", "xs=[1, 2]", "s=a=b"]) == {
        "k": 1, "name": "easy", "flag": True, "xs": [1, 2], "s": "a=b",
    }  # fmt: skip
    with pytest.raises(ConfigError):
        parse_env_args(["novalue"])


def test_choose_tasks_is_seeded_distinct_and_bounded():
    env = CalculatorEnv(num_tasks=20)
    first = choose_tasks(env, 5, seed=1)
    assert first == choose_tasks(env, 5, seed=1) and len(set(first)) == 5 and first == sorted(first)
    assert first != choose_tasks(env, 5, seed=2)
    assert choose_tasks(env, 50, seed=0) == list(range(20))
