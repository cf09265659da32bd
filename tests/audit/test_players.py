"""Who plays the audit's episodes: most envs alone, in order; a workspace env that keeps its
episodes in their state through copies, several episodes at once, with the same findings as
one after another; a copy is a fresh env of the same settings, and only such an env makes one."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import envhub
from envhub.audit import probes
from envhub.audit.players import Players
from envhub.audit.run import _play
from envhub.checks.checker import _starts
from envhub.sandbox import LocalSandbox, bwrap_problem
from envhub.sandbox.session import Session
from envhub.state import State
from envhub.workspace_env import Verdict, WorkspaceEnv

needs_sessions = pytest.mark.skipif(
    bwrap_problem() is not None or os.geteuid() != 0,
    reason="local sessions need bubblewrap and root",
)


class PairedEnv(WorkspaceEnv):
    """Pays 1 when the episode left ``done.txt``; its verifier waits for a second episode's
    verifier at a barrier (when given one), which only episodes played at once can pass."""

    name = "paired"
    episodes_in_state = True

    def __init__(self, barrier: threading.Barrier | None = None, **kwargs: Any) -> None:
        rows = [{"question": f"task {i}", "info": {"id": f"p{i}"}} for i in range(3)]
        super().__init__(rows, **kwargs)
        self.barrier = barrier
        self.threads: set[int] = set()

    def task_files(self, task: dict[str, Any]) -> dict[str, str]:
        return {"task.txt": task["question"] + "\n"}

    async def verify(self, session: Session, state: State) -> Verdict:
        self.threads.add(threading.get_ident())
        if self.barrier is not None:
            await asyncio.to_thread(self.barrier.wait, 60)
        done = await session.arun("test -e done.txt")
        return Verdict(float(done.ok))


@pytest.fixture(scope="module")
def sandbox() -> Iterator[LocalSandbox]:
    with LocalSandbox(base_uid=61960, max_concurrency=4, warm=0) as box:
        yield box


def play(env: Any, probe: Any, start: Any) -> Any:
    return _play(env, probe, start, 10)


def outcomes(found: list[Any]) -> list[tuple[Any, ...]]:
    return [(f.policy, f.seed, f.task, f.reward, f.error, f.conversation) for f in found]


@needs_sessions
def test_copies_play_episodes_at_once_with_the_findings_of_one_after_another(sandbox) -> None:
    alone = PairedEnv(sandbox=sandbox, max_turns=2)
    starts = _starts(alone, (0, 1))
    jobs = [(name, start) for name in ("empty", "junk-tools") for start in starts]
    with Players(alone, probes(alone), at_once=1) as players:
        assert players.envs == [alone]
        expected = players.play(jobs, play)
    paired = PairedEnv(threading.Barrier(2), sandbox=sandbox, max_turns=2)
    with Players(paired, probes(paired), at_once=2) as players:
        assert len(players.envs) == 2 and players.envs[1] is not paired
        found = players.play(jobs, play)
    # Every verifier passed the barrier: two episodes were at the verifier at once, each
    # played on a thread of its own (the copy's, and this one's).
    assert outcomes(found) == outcomes(expected)
    assert [f.reward for f in found] == [0.0, 0.0, 0.0, 0.0]
    assert len(paired.threads) == 2 and threading.get_ident() in paired.threads


def test_an_env_that_keeps_no_episode_copies_plays_alone_in_order() -> None:
    env = envhub.make("arithmetic")
    starts = _starts(env, (0, 1, 2))
    jobs = [(name, start) for name in ("echo", "numbers") for start in starts]
    with Players(env, probes(env), at_once=4) as players:
        assert players.envs == [env]
        found = players.play(jobs, play)
    assert [(f.policy, f.task) for f in found] == [
        ("echo", 0), ("echo", 499), ("echo", 999), ("numbers", 0), ("numbers", 499),
        ("numbers", 999),
    ]  # fmt: skip


@needs_sessions
def test_an_episode_copy_shares_the_settings_and_keeps_its_own_episode(sandbox) -> None:
    env = PairedEnv(sandbox=sandbox, max_turns=3)
    env.reset(options={"task_index": 1})
    copy = env.episode_copy()
    assert copy is not None and copy.state is None and copy._session is None
    assert (copy.dataset, copy.max_turns, copy.sandbox) == (env.dataset, 3, sandbox)
    copy.reset(options={"task_index": 2})
    assert env.state.task_index == 1 and copy.state.task_index == 2
    assert env.state.data["session"] is not copy.state.data["session"]
    copy.close()
    env.close()
    plain = PairedEnv(sandbox=sandbox)
    plain.episodes_in_state = False
    assert plain.episode_copy() is None
