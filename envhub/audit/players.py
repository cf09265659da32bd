"""Who plays the audit's episodes: the env itself, one episode after another; and, for a
workspace env that can copy itself for episodes (:meth:`~envhub.workspace_env.WorkspaceEnv.
episode_copy`), the env and its copies, :data:`EPISODES_AT_ONCE` episodes at once, each copy on
a thread of its own.

A workspace episode spends its time in its sandbox (tool calls, the verifier's pytest run),
so episodes on threads overlap those. Each copy plays the probes made for it (a policy that
reads the env's token budget reads its own copy's), and an episode's verdict does not depend on
which copy played it: the env declares that its episodes keep all they change in their state
and session (``episodes_in_state``). Every other env is played by itself, in order, on the
calling thread, as before.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from envhub._async import close_thread_loop
from envhub.audit.probes import Probe, probes
from envhub.audit.report import AuditFinding
from envhub.env import Env
from envhub.workspace_env import WorkspaceEnv

EPISODES_AT_ONCE = 4
"""At most this many episodes at once. Not bound to the cores: a workspace episode spends much
of its time waiting for its session (one call at a time: a tool, the verifier), so copies beyond
the cores still help (repo-repair's audit on 2 busy cores: 24-25 s with 4, 30-38 s with 2, 26-27 s
with 6)."""

Play = Callable[[Env, Probe, Any], "AuditFinding | None"]
"""(env, probe, start) -> the episode's finding (``run._play``)."""
Job = tuple[str, Any]
"""(probe name, start): one episode to play."""


class Players:
    """The env and its episode copies (none for most envs), each with its own probes.

    Use it as a context manager: the copies are closed at the end.
    """

    def __init__(self, env: Env, catalog: list[Probe], at_once: int | None = None) -> None:
        count = EPISODES_AT_ONCE if at_once is None else at_once
        self.envs: list[Env] = [env, *_copies(env, count - 1)]
        self.catalogs = [{p.name: p for p in catalog}]
        self.catalogs += [{p.name: p for p in probes(copy)} for copy in self.envs[1:]]

    def play(self, jobs: list[Job], play: Play) -> list[AuditFinding | None]:
        """Each job's episode, in the order of ``jobs``. The first error a player raises
        (not a crash of the env: :func:`play` records those) is raised once all stop."""
        results: list[AuditFinding | None] = [None] * len(jobs)
        pending: queue.SimpleQueue[int] = queue.SimpleQueue()
        for index in range(len(jobs)):
            pending.put(index)
        failures: list[BaseException] = []

        def work(player: int) -> None:
            env, catalog = self.envs[player], self.catalogs[player]
            while not failures:
                try:
                    index = pending.get_nowait()
                except queue.Empty:
                    return
                name, start = jobs[index]
                try:
                    results[index] = play(env, catalog[name], start)
                except BaseException as e:  # the others stop at their next job
                    failures.append(e)

        threads = [
            threading.Thread(target=_on_own_loop, args=(work, player), daemon=True)
            for player in range(1, len(self.envs))
        ]
        for thread in threads:
            thread.start()
        work(0)  # the env itself plays on this thread
        for thread in threads:
            thread.join()
        if failures:
            raise failures[0]
        return results

    def close(self) -> None:
        """Close the copies (the env itself is the caller's)."""
        for copy in self.envs[1:]:
            copy.close()

    def __enter__(self) -> Players:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _copies(env: Env, count: int) -> list[Env]:
    """Up to ``count`` episode copies of ``env`` (none unless it offers them)."""
    if count < 1 or not isinstance(env, WorkspaceEnv):
        return []
    made = [env.episode_copy() for _ in range(count)]
    return [copy for copy in made if copy is not None]


def _on_own_loop(work: Callable[[int], None], player: int) -> None:
    """``work(player)`` on this thread, then the thread's event loop closed (an episode's sync
    calls ran on it)."""
    try:
        work(player)
    finally:
        close_thread_loop()
