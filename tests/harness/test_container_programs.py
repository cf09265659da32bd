"""A harness command program in a container session (the container back end): it reaches the
recording endpoint, which the host serves inside the container's network namespace, and
nothing else; its files are the container's, read by the reward; its tokens are recorded."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from envhub.harness import CommandProgram, HarnessEnv
from envhub.rewards.rubric import Rubric, reward
from envhub.sandbox import Limits, Workspace
from envhub.state import State
from tests.harness.test_sandboxed import NOTE_AGENT, TASKS, answers, rollout

pytest.importorskip("openai")
pytest.importorskip("uvicorn")

RESULTS: list[str] = []


@pytest.fixture(scope="module")
def box(require_podman: None) -> Iterator[object]:
    from envhub.sandbox.container import ContainerSandbox

    yield ContainerSandbox(Limits(wall_time=60, memory_mb=1024), engine="podman")


@reward
async def saved_answer(state: State, answer: str) -> float:
    """1 when the agent left the answer in ``answer.txt`` (read from the container)."""
    RESULTS.append(str(state.data.get("result")))
    return float(answer in (await state.data["session"].read_file("answer.txt")).decode())


def test_a_command_agent_in_a_container_reaches_the_endpoint_and_nothing_else(
    box: object,
) -> None:
    RESULTS.clear()
    with socket.create_server(("127.0.0.1", 0)) as other:
        workspace = Workspace.from_files({"agent.py": NOTE_AGENT})
        program = CommandProgram(["python3", "agent.py", str(other.getsockname()[1])])
        traj = rollout(
            lambda: HarnessEnv(
                program, TASKS, rubric=Rubric([saved_answer]), sandbox=box, workspace=workspace
            ),
            answers,
        )
    assert traj.errors == [] and traj.outcome == "ok"
    assert traj.reward == 1.0
    assert [m.content for m in traj.messages if m.role == "assistant"] == ["The answer is 395."]
    assert sum(traj.loss_mask) == len("The answer is 395.") + 1
    assert RESULTS == ["host unreachable"]
