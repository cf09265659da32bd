"""Named agents: mini-swe-agent, as published, drives a task in a container session through
the recording endpoint: its commands run in the container, its submission ends the episode,
the verifier's reward is 1, and the tokens it was sent back are the policy's, exactly."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from envhub.harness import HarnessEnv
from envhub.rewards.rubric import Rubric, reward
from envhub.sandbox import Limits
from envhub.state import State
from envhub.types import Message
from tests.harness.test_sandboxed import TASKS, rollout

pytest.importorskip("minisweagent")
pytest.importorskip("uvicorn")

FENCE = "```"
REPLIES = [
    f"THOUGHT: compute it.\n\n{FENCE}mswea_bash_command\necho $((17 * 23 + 4)) > answer.txt && "
    f"cat /etc/debian_version | cut -c1-2\n{FENCE}",
    f"THOUGHT: done.\n\n{FENCE}mswea_bash_command\n"
    f"echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n{FENCE}",
]


@pytest.fixture(scope="module")
def box(require_podman: None) -> Iterator[object]:
    from envhub.sandbox.container import ContainerSandbox

    yield ContainerSandbox(Limits(wall_time=60, memory_mb=1024), engine="podman")


@reward
async def saved_answer(state: State, answer: str) -> float:
    """1 when ``answer.txt`` in the container holds the answer."""
    return float(answer in (await state.data["session"].read_file("answer.txt")).decode())


def scripted(messages: list[Message], tools: Any) -> str:
    """The agent's replies in order, by how many it has made."""
    return REPLIES[sum(m.role == "assistant" for m in messages)]


def test_mini_swe_agent_solves_a_task_in_a_container(box: object) -> None:
    from envhub.harness.agents import mini_swe_agent

    env = lambda: HarnessEnv(  # noqa: E731
        mini_swe_agent(step_limit=5), TASKS, rubric=Rubric([saved_answer]), sandbox=box
    )
    traj = rollout(env, scripted)
    assert traj.errors == [] and traj.outcome == "ok", traj.errors
    assert traj.reward == 1.0
    said = [m.content for m in traj.messages if m.role == "assistant"]
    assert said == REPLIES
    # what the agent saw of its first command: it ran in the container (Debian 12)
    observation = next(m.content for m in traj.messages if "<returncode>" in (m.content or ""))
    assert "<returncode>0</returncode>" in observation and "<output>\n12\n</output>" in observation
    assert sum(traj.loss_mask) == sum(len(r) + 1 for r in REPLIES)  # each reply and its end


def test_mini_swe_agent_plays_a_harbor_task_in_its_image(box: object, tmp_path) -> None:
    import envhub
    from tests.harbor.test_images import STAND_IN, make_task

    folder = make_task(tmp_path)
    solve = (
        f"THOUGHT: sum them.\n\n{FENCE}mswea_bash_command\n"
        f"cd /app && echo \"$GREETING $(jq '[.[]] | add' prices.json)\" > total.txt\n{FENCE}"
    )

    def policy(messages: list[Message], tools: Any) -> str:
        return [solve, REPLIES[1]][sum(m.role == "assistant" for m in messages)]

    def env() -> Any:
        return envhub.make(
            str(folder), agent="mini-swe-agent", sandbox="podman",
            image_map={"ubuntu:24.04": STAND_IN},
        )  # fmt: skip

    traj = rollout(env, policy)
    assert traj.errors == [] and traj.outcome == "ok", traj.errors
    assert traj.reward == 1.0  # the task's own tests, run in its container after the agent
    assert "Write $GREETING" in traj.messages[1].content  # the instruction, in the agent's prompt
    assert [m.content for m in traj.messages if m.role == "assistant"] == [solve, REPLIES[1]]


def test_the_terminus_agent_types_a_harbor_task_into_tmux(box: object, tmp_path) -> None:
    import json

    import envhub
    from tests.harbor.test_images import STAND_IN, make_task

    folder = make_task(tmp_path)
    dockerfile = folder / "environment" / "Dockerfile"
    dockerfile.write_text(
        dockerfile.read_text()
        + "RUN apt-get install -y -qq --no-install-recommends tmux >/dev/null\n"
    )
    typed = (
        "cd /app && echo \"$GREETING $(jq '[.[]] | add' prices.json)\" > total.txt; cat total.txt\n"
    )
    replies = [
        json.dumps(
            {"analysis": "", "plan": "sum", "commands": [{"keystrokes": typed, "duration": 0.5}]}
        ),
        "It is done, I think.",  # not JSON: answered with what was wrong
        json.dumps({"commands": [], "task_complete": True}),
    ]

    def policy(messages: list[Message], tools: Any) -> str:
        return replies[sum(m.role == "assistant" for m in messages)]

    traj = rollout(
        lambda: envhub.make(str(folder), agent="terminus", sandbox="podman",
                            image_map={"ubuntu:24.04": STAND_IN}),
        policy,
    )  # fmt: skip
    assert traj.errors == [] and traj.outcome == "ok", traj.errors
    assert traj.reward == 1.0
    users = [m.content for m in traj.messages if m.role == "user"]
    assert "hello 7" in users[1]  # the screen after the command: its output
    assert users[2].startswith("Invalid reply: no JSON object in the reply.")
    assert [m.content for m in traj.messages if m.role == "assistant"] == replies
