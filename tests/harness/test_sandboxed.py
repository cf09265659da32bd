"""Harness programs in the episode's sandbox session: a command agent reaches the endpoint and
nothing else, its files are there for the reward, what it leaves running ends with the
episode, its failures are recorded, and a Python agent runs its tools in the session."""

from __future__ import annotations

import asyncio
import os
import socket
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

from envhub.harness import CommandProgram, HarnessEnv
from envhub.rewards.rubric import Rubric, reward
from envhub.rollout.runner import RolloutRunner
from envhub.sandbox import Limits, LocalSandbox, Workspace, bwrap_problem
from envhub.sandbox._process import uid_processes
from envhub.state import State
from envhub.testing import ByteChatTokenizer, ScriptedEngine
from envhub.types import Message, Trajectory

pytest.importorskip("openai")
pytest.importorskip("uvicorn")
pytestmark = pytest.mark.skipif(
    bwrap_problem() is not None or os.geteuid() != 0,
    reason="local sessions need bubblewrap and root",
)

TASKS = [{"question": "What is 17 * 23 + 4?", "answer": "395"}]

# A stdlib-only agent: one call, the reply saved in the workspace; it also tries the host's
# other service (its port in argv[1]) and reports whether that was reachable.
NOTE_AGENT = textwrap.dedent(
    """
    import json, os, socket, sys, urllib.request
    task = sys.stdin.read()
    body = {"model": os.environ["OPENAI_MODEL"], "messages": [{"role": "user", "content": task}]}
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
                 "Content-Type": "application/json"})
    reply = json.load(urllib.request.urlopen(request))["choices"][0]["message"]["content"]
    open("answer.txt", "w").write(reply)
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2)
        print("reached the host")
    except OSError:
        print("host unreachable")
    if len(sys.argv) > 2:
        os.system(sys.argv[2])
    """
)


@pytest.fixture(scope="module")
def box() -> Iterator[LocalSandbox]:
    limits = Limits(wall_time=60, memory_mb=1024, processes=32)
    with LocalSandbox(limits, base_uid=61800, max_concurrency=4, warm=0) as box:
        yield box


@pytest.fixture
def host_service() -> Iterator[int]:
    """A TCP port something listens on, on the host's loopback."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


@reward
async def saved_answer(state: State, answer: str) -> float:
    """1 when the agent left the answer in ``answer.txt`` of its workspace (read from the
    session, which is still open when the rubric runs)."""
    session = state.data["session"]
    SEEN.append((session.uid, state.data.get("result"), len(session.processes())))
    return float(answer in (await session.read_file("answer.txt")).decode())


SEEN: list[tuple[int, Any, int]] = []
"""Each session's uid, the program's result and how many processes it left running, seen by
the reward (a test then checks that the uid owns no process once the episode is over)."""


def answers(messages: list[Message], tools: Any) -> str:
    return "The answer is 395."


def rollout(env_factory: Any, policy: Any) -> Trajectory:
    engine = ScriptedEngine(policy, ByteChatTokenizer())
    (traj,) = asyncio.run(RolloutRunner(engine, env_factory).run([0]))
    return traj


def note_env(box: LocalSandbox, port: int, *extra: str) -> Any:
    workspace = Workspace.from_files({"agent.py": NOTE_AGENT})
    program = CommandProgram(["python3", "agent.py", str(port), *extra])
    return lambda: HarnessEnv(
        program, TASKS, rubric=Rubric([saved_answer]), sandbox=box, workspace=workspace
    )


def test_a_command_agent_in_the_sandbox_reaches_the_endpoint_and_nothing_else(
    box: LocalSandbox, host_service: int
) -> None:
    SEEN.clear()
    traj = rollout(note_env(box, host_service), answers)
    assert traj.errors == [] and traj.outcome == "ok"
    assert traj.reward == 1.0  # its answer.txt, read from the session by the reward
    assert [m.content for m in traj.messages if m.role == "assistant"] == ["The answer is 395."]
    assert sum(traj.loss_mask) == len("The answer is 395.") + 1  # the reply and its end token
    # what it printed is its result: the host's other service was out of its reach
    assert [(result, left) for _, result, left in SEEN] == [("host unreachable", 0)]


def test_what_a_sandboxed_agent_leaves_running_ends_with_the_episode(
    box: LocalSandbox, host_service: int
) -> None:
    SEEN.clear()
    traj = rollout(note_env(box, host_service, "sleep 300 > /dev/null 2>&1 &"), answers)
    assert traj.reward == 1.0 and traj.outcome == "ok"
    ((uid, _, left),) = SEEN
    assert left == 1  # the sleeper outlived the agent, to the end of the episode
    assert uid_processes(uid, live=True) == []


def test_a_sandboxed_agent_that_fails_is_recorded_with_its_stderr(box: LocalSandbox) -> None:
    workspace = Workspace.from_files({"agent.py": NOTE_AGENT})
    failing = CommandProgram(["python3", "-c", "import sys; sys.exit('no model for me')"])
    env = lambda: HarnessEnv(failing, TASKS, sandbox=box, workspace=workspace)  # noqa: E731
    traj = rollout(env, answers)
    assert traj.outcome == "env_failure" and traj.turns == []
    assert "exited with status 1: no model for me" in traj.errors[0].message


async def tool_agent(client: Any, prompt: str, session: Any) -> str:
    """A Python agent on the host whose one tool, a shell, runs in the episode's session."""
    messages = [{"role": "user", "content": prompt}]
    reply = await client.chat.completions.create(model="m", messages=messages)
    command = reply.choices[0].message.content
    result = await session.arun(["/bin/sh", "-c", command])
    messages += [
        {"role": "assistant", "content": command},
        {"role": "user", "content": f"exit {result.exit_code}: {result.stdout}"},
    ]
    reply = await client.chat.completions.create(model="m", messages=messages)
    return reply.choices[0].message.content


def test_a_python_agent_runs_its_tools_in_the_session(box: LocalSandbox) -> None:
    def policy(messages: list[Message], tools: Any) -> str:
        if messages[-1].content.startswith("exit"):
            return "The answer is 395."
        return "echo $((17 * 23 + 4)) > answer.txt; id -u"

    env = lambda: HarnessEnv(  # noqa: E731
        tool_agent, TASKS, rubric=Rubric([saved_answer]), sandbox=box
    )
    traj = rollout(env, policy)
    assert traj.outcome == "ok" and traj.reward == 1.0
    shown = next(m.content for m in traj.messages if m.content.startswith("exit"))
    assert shown.startswith("exit 0: ") and shown.split()[2] != "0"  # not root in there


def test_a_program_in_the_program_host_cannot_take_the_session(box: LocalSandbox) -> None:
    from tests.harness.hosted_agents import breaks

    with pytest.raises(ValueError, match="cannot use the episode's sandbox session"):
        HarnessEnv(breaks, TASKS, sandbox=box, program_host="process")
