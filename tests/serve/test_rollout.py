"""The rollout runner on remote envs: the same episodes as on local ones, and a server killed
mid-episode recorded as an infrastructure failure (the server is the real `envhub serve`)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

import envhub
from envhub.envs.calculator import reference_policy
from envhub.rollout.runner import RolloutRunner
from envhub.testing import ByteChatTokenizer, ScriptedEngine
from envhub.types import Message, Trajectory


def roll_out(make: Callable[[], envhub.Env], policy: Any, tasks: list[int]) -> list[Trajectory]:
    engine = ScriptedEngine(policy, ByteChatTokenizer())
    runner = RolloutRunner(engine, make, max_concurrency=2, seed=3)
    return asyncio.run(runner.run(tasks, samples_per_task=2))


def test_the_runner_gets_the_same_episodes_from_a_remote_env(serve: Callable[..., Any]) -> None:
    url = serve("calculator").url()
    local = roll_out(lambda: envhub.make("calculator"), reference_policy, [0, 5])
    remote = roll_out(lambda: envhub.make(url), reference_policy, [0, 5])
    fields = {"reward", "reward_components", "outcome", "stop_reason", "metrics", "env"}
    fields |= {"token_ids", "loss_mask", "sampler_logprobs", "seed", "tools"}
    for here, there in zip(local, remote, strict=True):
        assert here.model_dump(include=fields) == there.model_dump(include=fields)
        assert [(m.role, m.content) for m in here.messages] == [
            (m.role, m.content) for m in there.messages
        ]
    assert [t.reward for t in remote] == [1.0] * 4


@pytest.fixture
def cli_server() -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """`envhub serve calculator --arg max_turns=4` in its own process."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
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
