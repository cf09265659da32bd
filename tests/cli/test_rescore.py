"""`envhub eval`, then `envhub rescore` with a new version of the env, through the CLI: the
eval's manifest, the exact report, the originals untouched, `envhub show` of the new results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import envhub
from envhub import registry
from envhub.cli.app import app
from envhub.env import SingleTurnEnv
from envhub.rewards.rubric import Rubric, reward
from envhub.rollout.io import read_trajectories

runner = CliRunner()
NAME = "cli-rescore-quiz"


@reward
def exact(response: str, answer: str) -> float:
    """1 for the reference answer."""
    return float(response == answer)


@reward
def brevity(response: str) -> float:
    """1 for an answer of at most two characters."""
    return float(len(response) <= 2)


class Quiz(SingleTurnEnv):
    """Answer a{i} to q{i}; version 0.0.1 scores exact match only."""

    name = NAME
    version = "0.0.1"

    def __init__(self, num_tasks: int = 2, brevity_weight: float = 0.5) -> None:
        self.brevity_weight = brevity_weight
        tasks = [{"question": f"q{i}", "answer": f"a{i}"} for i in range(num_tasks)]
        super().__init__(tasks)

    def default_rubric(self) -> Rubric:
        return Rubric([exact])


class QuizV2(Quiz):
    """0.0.2: brevity counts too, with a weight the constructor takes."""

    version = "0.0.2"

    def default_rubric(self) -> Rubric:
        return Rubric([exact, brevity], weights=[1.0, self.brevity_weight])


def chat(method: str, path: str, body: Any) -> tuple[int, Any]:
    """A chat server answering q{i} with a{i}, except q1 ("no idea")."""
    if path != "/v1/chat/completions":
        return 404, {"error": {"message": f"no route {path}"}}
    question = body["messages"][-1]["content"]
    text = "no idea" if question == "q1" else "a" + question[1:]
    message = {"role": "assistant", "content": text}
    return 200, {"choices": [{"message": message, "finish_reason": "stop"}]}


@pytest.fixture
def quiz() -> Any:
    """Registers ``Quiz`` (0.0.1); ``quiz(QuizV2)`` installs the next version in its place."""

    def install(cls: type) -> None:
        envhub.register(NAME, cls, override=True)

    install(Quiz)
    yield install
    registry._registered.pop(NAME, None)


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_eval_then_rescore_with_the_next_version(http_server, quiz, tmp_path: Path) -> None:
    server = http_server(chat)
    out = tmp_path / "eval"
    evaluated = runner.invoke(
        app,
        ["eval", NAME, "-u", f"{server.url}/v1", "-m", "solver", "--mode", "chat", "-n", "3",
         "-r", "2", "--concurrency", "1", "-a", "num_tasks=3", "-o", str(out)],
    )  # fmt: skip
    assert evaluated.exit_code == 0, evaluated.output
    config = json.loads((out / "config.json").read_text())
    assert config["env_refs"] == [{"name": NAME, "version": "0.0.1", "commit": None}]
    assert config["samplers"] == [
        {
            "engine": "openai",
            "mode": "chat",
            "model": "solver",
            "version": None,
            "sampling": {"temperature": 0.7, "top_p": 1.0, "top_k": None, "max_tokens": 512,
                         "stop": [], "seed": None, "logprobs": True},
            "chat_template_sha256": None,
        }
    ]  # fmt: skip
    assert json.loads((out / "summary.json").read_text())["outcomes"] == {
        "ok": 6, "policy_failure": 0, "env_failure": 0, "infra_failure": 0, "timeout": 0,
    }  # fmt: skip
    assert "│ outcomes                    │ ok 6" in evaluated.output
    before = files(out)

    quiz(QuizV2)
    result = runner.invoke(app, ["rescore", str(out), "--env", NAME, "-a", "brevity_weight=1"])
    assert result.exit_code == 0, result.output
    new = tmp_path / f"eval-rescored-{NAME}-0.0.2"
    assert result.output.splitlines() == [
        f"rescored 6 of 6 episodes with {NAME} 0.0.2 (scored by {NAME} 0.0.1)",
        "reward: 0.667 -> 1.333 (+0.667)",
        "  exact: 0.667 -> 0.667",
        "  brevity: - -> 0.667",
        "changed: 4 rewards, 6 component sets (of 6 episodes)",
        "biggest changes:",
        "  trajectories.jsonl:0 (task 0, sample 0): 1.000 -> 2.000 (+1.000)",
        "  trajectories.jsonl:1 (task 0, sample 1): 1.000 -> 2.000 (+1.000)",
        "  trajectories.jsonl:4 (task 2, sample 0): 1.000 -> 2.000 (+1.000)",
        "  trajectories.jsonl:5 (task 2, sample 1): 1.000 -> 2.000 (+1.000)",
        "replay diverged: 0 episodes",
        f"saved: {new}",
    ]
    assert files(out) == before
    rescored = read_trajectories(new / "trajectories.jsonl")
    assert [t.reward for t in rescored] == [2.0, 2.0, 0.0, 0.0, 2.0, 2.0]
    assert sorted(p.name for p in new.iterdir()) == [
        "rescore.json",
        "summary.json",
        "trajectories.jsonl",
    ]

    shown = runner.invoke(app, ["show", str(new), "-e", "0"])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert lines[0] == (
        f"episode 0: {NAME} v0.0.2 task 0 sample 0 | reward 2 (exact 1, brevity 1) | "
        "terminated, ok | 1 turns, 0 tokens"
    )
    assert lines[1:3] == [
        "sampled by openai (chat), model solver, temperature 0.7",
        f"rescored from {NAME} v0.0.1: reward 1 -> 2",
    ]

    again = runner.invoke(app, ["rescore", str(out), "--env", NAME])
    assert again.exit_code == 1
    assert str(again.exception) == f"{new} is not empty; give another --output"


def test_rescore_names_what_it_cannot_read(tmp_path: Path) -> None:
    result = runner.invoke(app, ["rescore", str(tmp_path), "--env", "calculator"])
    assert result.exit_code == 1
    assert str(result.exception) == (
        f"{tmp_path} holds no trajectories: give an `envhub eval` folder (trajectories.jsonl), "
        "an `envhub train` run folder (trajectories/step-*.jsonl) or a .jsonl file"
    )
