"""Programs run in the program host (a child process): the same record as in the runner's
process, failures of the right kind, cancellation reaching the child, and a host that dies."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from envhub.harness import HarnessEnv
from envhub.harness.host import ProgramHost
from envhub.rewards.rubric import Rubric
from envhub.rollout.runner import RolloutRunner
from envhub.testing import ByteChatTokenizer, ScriptedEngine
from envhub.types import Trajectory
from tests.harness.hosted_agents import (
    breaks,
    gives_up,
    reports_pid,
    returns_a_lock,
    waits_after_a_call,
)
from tests.harness.test_env import TASKS, adder_policy, assert_adder_episode, chat_agent, correct
from tests.harness.test_env import rollout as rollout_env
from tests.harness.test_failures import ask, only_error, rollout

pytest.importorskip("openai")
pytest.importorskip("uvicorn")


def rollout_on(tasks: list[dict[str, Any]], program: Any, policy: Any = None, **env_args: Any):
    """One hosted episode of ``program`` on ``tasks[0]``."""
    engine = ScriptedEngine(policy or (lambda m, t: "hi"), ByteChatTokenizer())
    runner = RolloutRunner(
        engine, lambda: HarnessEnv(program, tasks, program_host="process", **env_args)
    )
    (traj,) = asyncio.run(runner.run([0]))
    return traj


def test_a_hosted_program_records_the_same_episode_as_one_in_the_runners_process() -> None:
    def env(host: str) -> Any:
        return lambda: HarnessEnv(chat_agent, TASKS, rubric=Rubric([correct]), program_host=host)

    (hosted,) = rollout_env(env("process"), adder_policy)
    (local,) = rollout_env(env("thread"), adder_policy)
    assert_adder_episode(hosted)
    assert hosted.token_ids == local.token_ids and hosted.loss_mask == local.loss_mask
    assert os.getpid() != ProgramHost.shared()._process.pid


def test_a_program_that_does_not_pickle_is_refused_when_the_env_is_made() -> None:
    async def closure(client: Any) -> str:
        return await ask(client)

    with pytest.raises(TypeError, match="Define the function at module level"):
        HarnessEnv(closure, TASKS, program_host="process")
    with pytest.raises(ValueError, match="program_host must be 'thread' or 'process'"):
        HarnessEnv(chat_agent, TASKS, program_host="gpu")


def test_failures_in_the_host_are_recorded_as_the_same_kinds() -> None:
    policy = rollout(gives_up, program_host="process")
    assert policy.stop_reason == "program_gave_up" and policy.errors == []
    crash = rollout(breaks, program_host="process")
    assert crash.outcome == "env_failure" and only_error(crash) == ("harness.crash", "crash")
    assert "RuntimeError: the agent's parser broke" in crash.errors[0].message
    unsent = rollout(returns_a_lock, program_host="process")
    assert only_error(unsent) == ("harness.crash", "crash")
    assert "its result could not be sent back (TypeError" in unsent.errors[0].message


def test_a_program_stopped_at_its_deadline_is_cancelled_in_the_host(tmp_path: Path) -> None:
    marker = tmp_path / "cancelled"
    tasks = [{"question": "hi", "marker": str(marker)}]
    traj: Trajectory = rollout_on(tasks, waits_after_a_call, timeout=1.0)
    assert traj.outcome == "timeout" and only_error(traj) == ("harness.program", "timeout")
    assert marker.read_text() == "cancelled"  # the child's task saw the cancellation


def test_a_host_that_dies_fails_its_episodes_as_crashes_and_the_next_one_starts_anew(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "pid"
    tasks = [{"question": "hi", "marker": str(marker)}]

    def kill_host(messages: Any, tools: Any) -> str:
        os.kill(int(marker.read_text()), signal.SIGKILL)
        return "hi"

    traj = rollout_on(tasks, reports_pid, kill_host)
    assert traj.outcome == "env_failure"
    assert only_error(traj) == ("harness.crash", "crash")
    assert "the program host exited (status -9)" in traj.errors[0].message
    again = rollout(breaks, program_host="process")  # a new host takes the next episode
    assert "the agent's parser broke" in again.errors[0].message
    assert ProgramHost.shared()._process.pid != int(marker.read_text())


def test_a_program_the_host_cannot_import_fails_to_start_with_the_reason() -> None:
    traj = rollout(local_agent, program_host="process")
    assert traj.outcome == "env_failure" and traj.turns == []
    assert "the program host cannot load the program (ModuleNotFoundError" in (
        traj.errors[0].message
    )


async def local_agent(client: Any) -> str:
    """Defined in this test module, whose pytest name the child cannot import."""
    return await ask(client)
