"""The code envs: the shipped tasks are solvable and their buggy versions are not; both envs
pass check_env; the reference policies win through the rollout runner; the python tool
reports what ran; other task files load in the same format."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

import envhub
from envhub.checks.checker import check_env
from envhub.envs.code import CodeEnv, CodeFixEnv, load_tasks, python
from envhub.rewards.code import run_tests
from envhub.rollout.runner import RolloutRunner
from envhub.sandbox import Limits, LocalSandbox, bwrap_problem
from envhub.testing import ByteChatTokenizer, ScriptedEngine, replay

pytestmark = pytest.mark.skipif(
    bwrap_problem() is not None, reason=f"no bubblewrap here: {bwrap_problem()}"
)
TASKS = load_tasks()


@pytest.fixture(scope="module")
def sandbox() -> LocalSandbox:
    return LocalSandbox(Limits(wall_time=5), base_uid=61400, max_concurrency=8)


def test_the_shipped_tasks() -> None:
    assert len(TASKS) == 22
    assert len({t["info"]["id"] for t in TASKS}) == 22
    assert all({"solution", "buggy", "tests", "id"} <= t["info"].keys() for t in TASKS)


def test_every_solution_passes_and_every_buggy_version_fails(sandbox: LocalSandbox) -> None:
    async def score(field: str) -> list[float]:
        reports = await asyncio.gather(
            *[run_tests(sandbox, t["info"][field], t["info"]["tests"], timeout=2) for t in TASKS]
        )
        return [r.pass_rate for r in reports]

    assert asyncio.run(score("solution")) == [1.0] * len(TASKS)
    assert all(rate < 1.0 for rate in asyncio.run(score("buggy")))


@pytest.mark.parametrize("name", ["code", "code-fix"])
def test_code_envs_pass_check_env(name: str, sandbox: LocalSandbox) -> None:
    report = check_env(envhub.make(name, sandbox=sandbox, split="train[:4]"))
    assert report.passed, report.failures


@pytest.mark.parametrize("name", ["code", "code-fix"])
def test_reference_policy_wins_through_the_runner(name: str, sandbox: LocalSandbox) -> None:
    env = envhub.make(name, sandbox=sandbox)
    engine = ScriptedEngine(env.reference_policy, ByteChatTokenizer())
    runner = RolloutRunner(engine, lambda: envhub.make(name, sandbox=sandbox), max_concurrency=8)
    trajectories = asyncio.run(runner.run(range(0, 22, 3)))
    assert [t.reward for t in trajectories] == [1.0] * 8
    assert all(t.errors == [] and t.token_drift == [] for t in trajectories)
    assert [len(t.turns) for t in trajectories] == [1 if name == "code" else 2] * 8


def test_the_fix_env_shows_the_buggy_code_and_runs_the_tool(sandbox: LocalSandbox) -> None:
    env = CodeFixEnv(sandbox=sandbox)
    observation, _ = env.reset(options={"task_index": 0})
    assert observation[-1].content.endswith(
        "Buggy code:\n```python\ndef add(a, b):\n    return a - b\n```"
    )
    call = {"name": "python", "arguments": {"code": "print(2 + 2)\nimport sys\nsys.exit(3)"}}
    observation, reward, terminated, _, _ = env.step(f"<tool_call>{json.dumps(call)}</tool_call>")
    assert (observation[0].role, observation[0].content, reward, terminated) == (
        "tool",
        "[exit 3]\nstdout:\n4\n",
        0.0,
        False,
    )
    _, reward, terminated, _, info = env.step("```python\ndef add(a, b):\n    return a + b\n```")
    assert (reward, terminated, info["metrics"]) == (
        1.0,
        True,
        {"tool_calls": 1, "tests_passed": 4, "tests_total": 4},
    )


def test_the_python_tool_reports_a_timeout(sandbox: LocalSandbox) -> None:
    text = asyncio.run(
        python.ainvoke({"code": "import time\ntime.sleep(60)"}, {"sandbox": sandbox})
    )
    assert text.startswith("[timeout after 5.")


def test_a_wrong_answer_scores_its_pass_rate(sandbox: LocalSandbox) -> None:
    engine = ScriptedEngine(replay("```python\ndef add(a, b):\n    return a + b + (a < 0)\n```"))
    runner = RolloutRunner(engine, lambda: CodeEnv(sandbox=sandbox))
    [trajectory] = asyncio.run(runner.run([0]))
    assert (trajectory.reward, trajectory.reward_components) == (0.75, {"tests": 0.75})


def test_tasks_from_your_own_file(tmp_path: Path, sandbox: LocalSandbox) -> None:
    row = {
        "question": "Write `double(x)`.",
        "tests": json.dumps([{"fn": "double", "args": [2], "expected": 4}]),
        "solution": "def double(x):\n    return 2 * x\n",
    }
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(row) + "\n")
    env = CodeEnv(data_files=str(path), sandbox=sandbox)
    assert env.dataset[0]["info"]["tests"] == [{"fn": "double", "args": [2], "expected": 4}]
    assert check_env(env).passed
