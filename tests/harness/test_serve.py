"""``envhub serve`` a harness env: the program runs beside the server, and a client's episodes
(segments included) are the local ones exactly."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import envhub
from envhub.harness import HarnessEnv
from envhub.rewards.rubric import Rubric
from envhub.rollout.runner import RolloutRunner
from envhub.testing import ByteChatTokenizer, ScriptedEngine
from envhub.types import Message

from .test_env import ADD, TASKS, call, chat_agent, correct, run_tool

pytest.importorskip("websockets")
TIMINGS = {"seconds", "generate_seconds", "env_seconds"}


def comparable(trajectory: Any) -> dict[str, Any]:
    """Everything on a trajectory but wall-clock times and where it ran."""
    data = trajectory.model_dump(exclude={"seconds", "env", "sampler"})
    data["turns"] = [{k: v for k, v in t.items() if k not in TIMINGS} for t in data["turns"]]
    return data


@contextlib.contextmanager
def serving(env: str) -> Iterator[int]:
    """``envhub serve env`` under uvicorn in a thread of this process; yields its port."""
    import uvicorn

    from envhub.serve.server import ServeSettings, build_app, uvicorn_config

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    settings = ServeSettings(env=env)
    server = uvicorn.Server(uvicorn_config(settings, build_app(settings), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(timeout=30)


async def agent_that_restarts(client: Any, prompt: str) -> str:
    """The adder's loop, but its last call carries only a summary (a second segment)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    reply = await client.chat.completions.create(model="m", messages=messages, tools=[ADD])
    first = reply.choices[0].message.tool_calls[0]
    summary = [{"role": "user", "content": f"{prompt} (so far: {run_tool(first)})"}]
    reply = await client.chat.completions.create(model="m", messages=summary)
    return reply.choices[0].message.content


class Adder(HarnessEnv):
    name = "test-harness-adder"

    def __init__(self, restart: bool = False) -> None:
        program = agent_that_restarts if restart else chat_agent
        super().__init__(program, TASKS, rubric=Rubric([correct]))


def policy(messages: list[Message], tools: Any) -> str:
    results = [m.content for m in messages if m.role == "tool"]
    if "so far: 5" in (messages[-1].content or ""):
        return "9"
    if not results:
        return call("add", a=2, b=3)
    return call("add", a=int(results[0]), b=4) if len(results) == 1 else f"= {results[-1]}"


@pytest.fixture
def served() -> Iterator[str]:
    from envhub import registry

    envhub.register(Adder.name, Adder, override=True)
    with serving(Adder.name) as port:
        yield f"ws://127.0.0.1:{port}/{Adder.name}"
    registry._registered.pop(Adder.name, None)


@pytest.mark.parametrize("restart", [False, True])
def test_a_served_harness_env_records_what_the_local_one_does(served: str, restart: bool) -> None:
    def roll_out(make: Any) -> list[Any]:
        runner = RolloutRunner(ScriptedEngine(policy, ByteChatTokenizer()), make, seed=3)
        return asyncio.run(runner.run([0], samples_per_task=2))

    local = roll_out(lambda: Adder(restart))
    remote = roll_out(lambda: envhub.make(f"{served}?restart={str(restart).lower()}"))
    assert [t.reward for t in local] == [1.0, 1.0]
    assert [len(t.segments) for t in local] == [int(restart)] * 2
    assert [comparable(t) for t in remote] == [comparable(t) for t in local]
