"""The rollout runner on remote envs: the same episodes as on local ones, and a server killed
mid-episode recorded as an infrastructure failure (the server is the real `envhub serve`)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

import envhub
from envhub.defaults import free_port
from envhub.envs.calculator import reference_policy
from envhub.rollout.runner import RolloutRunner
from envhub.testing import ByteChatTokenizer, ScriptedEngine
from envhub.types import Message, Trajectory

TIMINGS = {"seconds", "generate_seconds", "env_seconds"}
BAD_CALL = '<tool_call>{"name": "calculate", "arguments": {}}</tool_call>'


def roll_out(
    make: Callable[[], envhub.Env],
    policy: Any,
    tasks: list[int],
    tokenizer: ByteChatTokenizer | None = None,
) -> list[Trajectory]:
    engine = ScriptedEngine(policy, tokenizer or ByteChatTokenizer())
    runner = RolloutRunner(engine, make, max_concurrency=2, seed=3)
    return asyncio.run(runner.run(tasks, samples_per_task=2))


def comparable(trajectory: Trajectory) -> dict[str, Any]:
    """Everything on a trajectory but wall-clock times."""
    data = trajectory.model_dump(exclude={"seconds"})
    data["turns"] = [{k: v for k, v in t.items() if k not in TIMINGS} for t in data["turns"]]
    return data


def bad_call_first(messages: list[Message], tools: Any) -> str:
    """A tool call without its arguments (a tool error), then the reference policy."""
    return BAD_CALL if messages[-1].role == "user" else reference_policy(messages, tools)


@pytest.mark.parametrize(
    ("policy", "reward", "tool_counts"),
    [(reference_policy, 1.0, [(1, 0), (0, 0)]), (bad_call_first, 0.0, [(1, 1), (0, 0)])],
)
def test_the_runner_gets_the_same_trajectories_from_a_remote_env(
    serve: Callable[..., Any], policy: Any, reward: float, tool_counts: list[tuple[int, int]]
) -> None:
    url = serve("calculator").url()
    local = roll_out(lambda: envhub.make("calculator"), policy, [0, 5])
    remote = roll_out(lambda: envhub.make(url), policy, [0, 5])
    for here, there in zip(local, remote, strict=True):
        assert comparable(there) == comparable(here)
        assert there.messages == here.messages  # as Messages, with their parsed tool calls
    assert [t.reward for t in remote] == [reward] * 4
    assert all(t.messages[2].tool_calls for t in remote)  # the first turn's, parsed
    assert [[(x.tool_calls, x.tool_errors) for x in t.turns] for t in remote] == [tool_counts] * 4


@pytest.mark.parametrize(("room", "tool_validity"), [(60, 0.0), (120, 1.0)])
def test_an_episode_the_runner_cuts_is_scored_on_the_server_as_locally(
    serve: Callable[..., Any], room: int, tool_validity: float
) -> None:
    url = serve("calculator").url()
    env = envhub.make("calculator")
    observation, _ = env.reset(options={"task_index": 0})
    prompt = ByteChatTokenizer().render_sync(observation, env.tool_schemas, True)
    # Room for `room` tokens after the prompt: the first turn (a tool call) is cut at 60, the
    # second at 120; either way the runner ends the episode (max_context) and the env scores it.
    local, remote = (
        roll_out(make, reference_policy, [0], ByteChatTokenizer(max_length=len(prompt) + room))
        for make in (lambda: envhub.make("calculator"), lambda: envhub.make(url))
    )
    for here, there in zip(local, remote, strict=True):
        assert comparable(there) == comparable(here)
        assert (there.stop_reason, there.truncated) == ("max_context", True)
        assert there.reward_components == {"correct": 0.0, "tool_validity": tool_validity}


@pytest.fixture
def cli_server() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """`envhub serve calculator --arg max_turns=4` in its own process."""
    port = free_port()
    command = [sys.executable, "-m", "envhub.cli", "serve", "calculator", "--port", str(port)]
    process = subprocess.Popen(
        [*command, "--arg", "max_turns=4"], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 30
    while True:
        assert process.poll() is None, process.stderr.read().decode()  # type: ignore[union-attr]
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                break
        except httpx.TransportError:
            assert time.monotonic() < deadline, "envhub serve did not start"
            time.sleep(0.05)
    yield process, port
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=15)


def test_envhub_serve_serves_with_its_arguments_and_stops_on_ctrl_c(
    cli_server: tuple[subprocess.Popen[bytes], int],
) -> None:
    process, port = cli_server
    remote = envhub.make(f"ws://127.0.0.1:{port}/calculator")
    assert remote.max_turns == 4
    remote.reset(seed=0)
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=15) == 128 + signal.SIGINT  # uvicorn re-raises it once done
    log = process.stderr.read().decode()  # type: ignore[union-attr]
    assert f"serving calculator on ws://127.0.0.1:{port}/calculator and http://" in log
    # uvicorn closes the connections first (1012), and the app closes their sessions
    assert "a connection went away; closing its 1 session(s)" in log


def test_a_server_killed_mid_episode_is_an_infra_failure_on_the_trajectory(
    cli_server: tuple[subprocess.Popen[bytes], int],
) -> None:
    process, port = cli_server

    def kill_then_answer(messages: list[Message], tools: Any) -> str:
        if messages[-1].role == "tool":  # the episode is under way: the server dies now
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
        return reference_policy(messages, tools)

    engine = ScriptedEngine(kill_then_answer)
    make = lambda: envhub.make(f"ws://127.0.0.1:{port}/calculator", timeout=5)  # noqa: E731
    runner = RolloutRunner(engine, make, max_concurrency=1)
    killed, after = asyncio.run(runner.run([0, 1]))
    assert (killed.outcome, after.outcome) == ("infra_failure", "infra_failure")
    [error] = killed.errors
    assert (error.stage, error.type, error.turn, error.infra) == (
        "env.step",
        "RemoteEnvUnavailableError",
        1,
        True,
    )
    assert "the session was lost mid-episode" in error.message
    assert [m.role for m in killed.messages] == ["system", "user", "assistant", "tool", "assistant"]
    [error] = after.errors  # the next episode cannot even start: the server is gone
    assert (error.stage, error.infra) == ("env.reset", True)
    assert f"cannot reach ws://127.0.0.1:{port}/calculator" in error.message
