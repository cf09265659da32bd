"""WorkspaceEnv: a session per episode, files that persist across an episode's calls and never
across a group's samples, one prepared workspace per task, and the session closed however the
episode ends (answer, truncation, the runner cutting it off, close)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from envhub.rollout.runner import RolloutRunner
from envhub.sandbox import LocalSandbox, Sandbox, Workspace, bwrap_problem
from envhub.sandbox._process import uid_processes
from envhub.sandbox.session import Session, SessionPaths
from envhub.state import State
from envhub.testing import ByteChatTokenizer, ScriptedEngine, replay
from envhub.workspace_env import WORKSPACES, Verdict, WorkspaceEnv

pytestmark = pytest.mark.skipif(
    bwrap_problem() is not None or os.geteuid() != 0,
    reason="local sessions need bubblewrap and root",
)


def call(command: str) -> str:
    payload = {"name": "bash", "arguments": {"command": command}}
    return f"<tool_call>\n{json.dumps(payload)}\n</tool_call>"


class MarkerEnv(WorkspaceEnv):
    """Tasks of one file; the reward is 1 when the episode left ``done.txt`` saying ``yes``."""

    name = "marker"

    def __init__(self, **kwargs: Any) -> None:
        rows = [{"question": f"task {i}", "info": {"id": f"t{i}"}} for i in range(2)]
        super().__init__(rows, **kwargs)
        self.verified: list[str] = []

    def task_files(self, task: dict[str, Any]) -> dict[str, str]:
        return {"task.txt": task["question"] + "\n"}

    async def verify(self, session: Session, state: State) -> Verdict:
        result = await session.arun("cat done.txt 2>/dev/null; ls")
        self.verified.append(result.stdout)
        return Verdict(float(result.stdout.startswith("yes")), {"files": result.stdout.count("\n")})


@pytest.fixture(scope="module")
def sandbox() -> Iterator[LocalSandbox]:
    with LocalSandbox(base_uid=61450, max_concurrency=4, warm=0) as box:
        yield box
        # Every episode's session ended with its processes (a `sleep 600 &` among them).
        assert [p for uid in box.uids.uids for p in uid_processes(uid, live=True)] == []


def tool_replies(trajectory: Any) -> list[str]:
    return [m.content for m in trajectory.messages if m.role == "tool"]


def test_files_persist_within_an_episode_and_never_across_samples(sandbox) -> None:
    policy = replay(
        call("ls; test -e mine.txt && echo seen || echo fresh; echo yes > done.txt"),
        call("cat done.txt"),
        "finished",
    )
    engine = ScriptedEngine(policy, ByteChatTokenizer())
    runner = RolloutRunner(engine, lambda: MarkerEnv(sandbox=sandbox), max_concurrency=2)
    trajectories = asyncio.run(runner.run([0, 1], samples_per_task=2))
    assert [tool_replies(t) for t in trajectories] == [
        ["[exit 0]\ntask.txt\nfresh", "[exit 0]\nyes"]
    ] * 4
    assert [t.reward for t in trajectories] == [1.0] * 4
    assert [t.reward_components for t in trajectories] == [{"verifier": 1.0, "files": 3.0}] * 4


def test_a_group_shares_one_prepared_workspace_per_task(sandbox) -> None:
    env = MarkerEnv(sandbox=sandbox)
    rows = env.dataset
    first, again = env.workspace_for(rows[0]), MarkerEnv(sandbox=sandbox).workspace_for(rows[0])
    assert isinstance(first, Workspace) and first is again
    assert env.workspace_for(rows[1]) is not first
    assert WORKSPACES[("MarkerEnv", "t0")] is first
    assert sorted(p.name for p in first.path.iterdir()) == ["task.txt"]


def test_a_truncated_episode_is_verified_and_its_session_closed(sandbox) -> None:
    env = MarkerEnv(sandbox=sandbox, max_turns=1)
    env.reset(options={"task_index": 0})
    session = env.state.data["session"]
    _, reward, terminated, truncated, info = env.step(call("echo yes > done.txt"))
    assert (reward, terminated, truncated, info["stop_reason"]) == (1.0, False, True, "max_turns")
    assert env._session is None
    with pytest.raises(Exception, match="closed"):
        session.run("true")


def test_the_runner_cutting_an_episode_short_still_verifies(sandbox) -> None:
    env = MarkerEnv(sandbox=sandbox)
    env.reset(options={"task_index": 1})
    reward, info = asyncio.run(env.atruncate("max_tokens"))
    assert (reward, info["stop_reason"]) == (0.0, "max_tokens")
    assert env.verified == ["task.txt\n"] and env._session is None


def test_an_episode_left_open_is_closed_by_the_next_reset_or_close(sandbox) -> None:
    env = MarkerEnv(sandbox=sandbox)
    env.reset(options={"task_index": 0})
    env.step(call("sleep 600 & echo started"))
    abandoned = env.state.data["session"]
    env.reset(options={"task_index": 0})  # the engine failed mid-episode: nothing finished it
    with pytest.raises(Exception, match="closed"):
        abandoned.run("true")
    current = env.state.data["session"]
    env.close()
    with pytest.raises(Exception, match="closed"):
        current.run("true")
    assert env.verified == []  # an episode that never ended is not scored


class FilesMarkerEnv(MarkerEnv):
    """MarkerEnv, whose verdict reads nothing but the files, saying so."""

    name = "files-marker"
    verdict_from_files = True


def play(env: WorkspaceEnv, task: int, *replies: str) -> tuple[float, bool]:
    """(reward, verdict reused) of one episode of ``replies``."""
    env.reset(options={"task_index": task})
    for reply in replies:
        _, reward, terminated, truncated, _ = env.step(reply)
    assert terminated or truncated
    return reward, env.state.data["verdict_reused"]


def test_a_verdict_is_reused_for_the_same_task_and_files_within_the_block(sandbox) -> None:
    env = FilesMarkerEnv(sandbox=sandbox)
    write = call("echo yes > done.txt")
    with env.reusing_verdicts():
        played = [
            play(env, 0, "nothing done"),
            play(env, 0, "still nothing"),  # the same files: the first episode's verdict
            play(env, 1, "nothing done"),  # another task
            play(env, 0, write, "done"),
            play(env, 0, write, "done"),  # written again, later: other files (their times)
            play(env, 0, call("ls -la"), "looked"),  # a command that changed nothing
        ]
    assert played == [(0.0, False), (0.0, True), (0.0, False), (1.0, False), (1.0, False),
                      (0.0, True)]  # fmt: skip
    assert len(env.verified) == 4
    assert play(env, 0, "nothing done") == (0.0, False)  # out of the block: verified
    assert len(env.verified) == 5


def test_verdicts_are_not_reused_unless_the_env_declares_them_a_function_of_the_files(sandbox):
    env = MarkerEnv(sandbox=sandbox)
    with env.reusing_verdicts():
        assert [play(env, 0, "nothing done") for _ in range(2)] == [(0.0, False)] * 2
    assert len(env.verified) == 2


class ShownMarkerEnv(MarkerEnv):
    """MarkerEnv whose sessions show the working folder again at /work, the model's folder."""

    name = "shown-marker"

    def session_for(self, sandbox: Sandbox, workspace: Workspace, task: dict[str, Any]) -> Session:
        paths = SessionPaths(workdir=("/work",))
        return sandbox.session(workspace, limits=self.limits_for(task), paths=paths)

    def workdir_for(self, task: dict[str, Any]) -> str:
        return "/work"


def test_the_model_works_in_the_folder_the_env_names(sandbox) -> None:
    env = ShownMarkerEnv(sandbox=sandbox)
    env.reset(options={"task_index": 0})
    create = {"name": "create", "arguments": {"path": "/work/done.txt", "file_text": "yes\n"}}
    observation, *_ = env.step(f"<tool_call>\n{json.dumps(create)}\n</tool_call>")
    assert observation[0].content == "Wrote /work/done.txt (1 lines, 4 bytes)."
    observation, *_ = env.step(call("pwd && cat /sandbox/done.txt"))
    assert observation[0].content == "[exit 0]\n/work\nyes"
    _, reward, terminated, _, _ = env.step("finished")
    assert (reward, terminated, env.verified) == (1.0, True, ["yes\ndone.txt\ntask.txt\n"])
