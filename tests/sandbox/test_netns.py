"""Runs keep their uid's network namespace (``envhub.sandbox.netns``): the same one for each run
of a uid, another for each other uid, none of the host's, loopback up; and where none can be
made bubblewrap makes one per run as before."""

from __future__ import annotations

import asyncio
import os

import pytest

from envhub.sandbox import Limits, LocalSandbox, netns

from .conftest import requires_bwrap

pytestmark = requires_bwrap

NAMESPACE = "import os; print(os.readlink('/proc/self/ns/net'))"
LOOPBACK = (
    "import socket\n"
    "with socket.socket() as s:\n"
    "    s.bind(('127.0.0.1', 0)); s.listen()\n"
    "    with socket.create_connection(s.getsockname(), timeout=2) as c:\n"
    "        c.sendall(b'hi'); print(s.accept()[0].recv(2).decode())\n"
)


def _namespaces(box: LocalSandbox, runs: int) -> list[str]:
    async def many() -> list[str]:
        results = await asyncio.gather(
            *[box.arun_python(f"import time; time.sleep(0.3)\n{NAMESPACE}") for _ in range(runs)]
        )
        return [r.stdout.strip() for r in results]

    return asyncio.run(many())


@pytest.mark.skipif(os.geteuid() != 0, reason="namespaces are kept only when envhub is root")
def test_a_uid_keeps_its_namespace_and_concurrent_runs_have_their_own() -> None:
    box = LocalSandbox(Limits(wall_time=10), base_uid=61500, max_concurrency=3)
    assert box.keeps_netns
    host = os.readlink("/proc/self/ns/net")

    first = _namespaces(box, 3)  # three at once: three uids
    again = _namespaces(box, 3)

    assert len(set(first)) == 3 and host not in first
    assert sorted(again) == sorted(first)  # the same three, kept
    assert box.run_python(LOOPBACK).stdout == "hi\n"
    shared = box.run_python(NAMESPACE, limits=Limits(wall_time=10, network=True))
    assert shared.stdout.strip() == host  # network=True: the host's, as before


def test_without_a_kept_namespace_each_run_gets_a_new_one(monkeypatch) -> None:
    def refused() -> int:
        raise PermissionError(1, "unshare(CLONE_NEWNET): Operation not permitted")

    monkeypatch.setattr(netns, "_namespaces", {})
    monkeypatch.setattr(netns, "_unavailable", [])
    monkeypatch.setattr(netns, "_new_namespace", refused)
    box = LocalSandbox(Limits(wall_time=10), base_uid=61600, max_concurrency=3)

    seen = _namespaces(box, 3)

    assert netns.netns_path(61600) is None
    assert len(set(seen)) == 3 and os.readlink("/proc/self/ns/net") not in seen
    assert box.run_python(LOOPBACK).stdout == "hi\n"
