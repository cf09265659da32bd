"""Episodes of Harbor tasks written as a Harbor job folder (:mod:`envhub.harbor.results`):
two tasks of examples/harbor, two trials each, one task solved by its reference solution and
one not; the job's and each trial's documents hold Harbor's names, rewards and pass@k."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from envhub.errors import ConfigError
from envhub.harbor.env import HarborEnv
from envhub.harbor.results import pass_at_k, write_harbor_job
from envhub.sandbox import bwrap_problem

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "harbor"


def test_pass_at_k_is_harbors_estimate() -> None:
    def trials(task: str, *rewards: float) -> list[dict[str, Any]]:
        return [{"task_name": task, "verifier_result": {"rewards": {"reward": r}}} for r in rewards]

    ten = trials("a", 1, 0, 0, 0, 0, 0, 0, 0, 0, 0) + trials("b", *[1.0] * 10)
    assert pass_at_k(ten) == pytest.approx({"2": 0.6, "4": 0.7, "5": 0.75, "8": 0.9, "10": 1.0})
    assert pass_at_k(trials("a", 1, 0.5)) == {}  # a partial reward: none, as Harbor
    assert pass_at_k(trials("a", 1)) == {}  # k starts at 2


@pytest.mark.skipif(bwrap_problem() is not None, reason=f"no bubblewrap: {bwrap_problem()}")
def test_eval_episodes_become_a_harbor_job(tmp_path: Path) -> None:
    from envhub.rollout.runner import RolloutRunner
    from envhub.testing import ByteChatTokenizer, ScriptedEngine

    env = HarborEnv(EXAMPLES)
    names = [env.task_of(row).name for row in env.dataset]
    solve, skip = names.index("hello-file"), names.index("fix-median")

    def policy(messages: list[Any], tools: Any) -> str:
        solved = "hello.txt" in (messages[1].content or "")
        return env.reference_policy(messages, tools) if solved else "Done."

    runner = RolloutRunner(ScriptedEngine(policy, ByteChatTokenizer()), lambda: HarborEnv(EXAMPLES))
    trajectories = asyncio.run(runner.run([skip, solve], samples_per_task=2))
    tasks = {i: env.task_of(row) for i, row in enumerate(env.dataset)}
    job = write_harbor_job(tmp_path / "job-1", trajectories, tasks, model="m")
    env.close()

    result = json.loads((job / "result.json").read_text())
    evals = result["stats"]["evals"]["envhub__m__adhoc"]
    assert (result["n_total_trials"], result["stats"]["n_errored_trials"]) == (4, 0)
    assert (evals["n_trials"], evals["metrics"], evals["pass_at_k"]) == (
        4,
        [{"mean": 0.5}],
        {"2": 0.5},
    )
    trials = [json.loads(p.read_text()) for p in sorted(job.glob("*/result.json"))]
    assert sorted((t["task_name"], t["verifier_result"]["rewards"]["reward"]) for t in trials) == [
        ("fix-median", 0.0), ("fix-median", 0.0),
        ("hello-file", 1.0), ("hello-file", 1.0),
    ]  # fmt: skip
    assert sorted(evals["reward_stats"]["reward"]["1.0"]) == sorted(
        t["trial_name"] for t in trials if t["task_name"] == "hello-file"
    )
    hello = next(t for t in trials if t["task_name"] == "hello-file")
    assert hello["task_id"] == {"path": str(EXAMPLES / "hello-file")}
    assert hello["trial_name"].startswith("hello-file__")


@pytest.mark.skipif(bwrap_problem() is not None, reason=f"no bubblewrap: {bwrap_problem()}")
def test_envhub_eval_writes_the_harbor_job(http_server, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from envhub.cli.app import app
    from envhub.types import Message

    task = str(EXAMPLES / "hello-file")
    policy = HarborEnv(task).reference_policy

    def solver(method: str, path: str, body: Any) -> tuple[int, Any]:
        if path == "/v1/models":
            return 200, {"data": [{"id": "solver"}]}
        text = policy([Message.model_validate(m) for m in body["messages"]], body.get("tools"))
        return 200, {"choices": [{"message": {"role": "assistant", "content": text},
                                  "finish_reason": "stop"}]}  # fmt: skip

    url, job = f"{http_server(solver).url}/v1", tmp_path / "harbor-job"
    args = ["eval", task, "-u", url, "-r", "2", "-o", str(tmp_path / "run")]
    result = CliRunner().invoke(app, [*args, "--harbor-results", str(job)])
    assert result.exit_code == 0, result.output
    assert f"harbor job: {job}" in result.output
    evals = json.loads((job / "result.json").read_text())["stats"]["evals"]
    assert evals["envhub__solver__adhoc"]["pass_at_k"] == {"2": 1.0}
    assert len(list(job.glob("hello-file__*/verifier/reward.txt"))) == 2
    refused = CliRunner().invoke(app, ["eval", "calculator", "-u", url, "--harbor-results", "x"])
    assert isinstance(refused.exception, ConfigError)  # the CLI's main prints it as one line
    assert "'calculator' is no task folder" in str(refused.exception)
