"""Zygote runs (as root): a run forked into its sandbox holds no privilege, no file descriptor
and no module of the zygote's, and a zygote that died is replaced."""

from __future__ import annotations

import os
import signal

import pytest

from envhub.sandbox import LocalSandbox

from .conftest import live_sandbox_processes, requires_bwrap

pytestmark = requires_bwrap

BASE = 61300
"""This module's uids (a pool of its own)."""


@pytest.fixture(scope="module")
def box() -> LocalSandbox:
    sandbox = LocalSandbox(warm=2, base_uid=BASE, max_concurrency=4)
    if not sandbox.zygote:
        pytest.skip("zygotes serve runs only when envhub runs as root")
    yield sandbox
    sandbox.close()


LOOK = (
    "import os, sys\n"
    "status = dict(line.split(':\\t', 1) for line in open('/proc/self/status').read().splitlines()"
    " if line.startswith(('Cap', 'NoNewPrivs', 'Uid', 'Gid', 'Groups')))\n"
    "print(sorted((k, v.strip()) for k, v in status.items()))\n"
    "print(sorted(os.listdir('/proc/self/fd')), os.getpid(), os.getppid(),"
    " os.getsid(0) == os.getpid())\n"
    "print(sorted(m for m in ('ctypes', '_ctypes', 'socket', '_socket') if m in sys.modules))\n"
    "print(os.stat('/proc/self/fd').st_uid == os.getuid())\n"
)


def test_a_zygote_run_holds_nothing_of_the_zygote(box: LocalSandbox) -> None:
    for _ in range(3):  # a sandbox started for the call, then sandboxes started ahead
        result = box.run_python(LOOK)
        status, fds, modules, owned = result.stdout.splitlines()
        uid = dict(eval(status))["Uid"].split()[0]  # noqa: S307 - our own printout
        assert eval(status) == [  # noqa: S307
            ("CapAmb", "0000000000000000"),
            ("CapBnd", "0000000000000000"),
            ("CapEff", "0000000000000000"),
            ("CapInh", "0000000000000000"),
            ("CapPrm", "0000000000000000"),
            ("Gid", "\t".join([uid] * 4)),
            ("Groups", ""),
            ("NoNewPrivs", "1"),
            ("Uid", "\t".join([uid] * 4)),
        ]
        assert int(uid) in box.uids.uids
        # stdio and listdir's own fd; pid 2 as in a cold start; its parent is outside.
        assert fds == "['0', '1', '2', '3'] 2 0 True"
        assert (modules, owned) == ("[]", "True")
    assert box.zygote_runs == 3 and live_sandbox_processes(box) == []


def test_a_dead_zygote_is_replaced(box: LocalSandbox) -> None:
    assert box.run_python("print(1)").stdout == "1\n"
    (zygote,) = box._zygotes.values()
    os.kill(zygote.proc.pid, signal.SIGKILL)
    zygote.proc.wait()
    runs = box.zygote_runs
    assert box.run_python("print(2)").stdout == "2\n"
    assert box.zygote_runs == runs + 1 and box._zygotes[("-I",)] is not zygote


def test_a_zygote_that_died_unseen_is_replaced_for_the_call(
    box: LocalSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its death noticed only when the call's request cannot be sent: the call still runs."""
    assert box.run_python("print(1)").stdout == "1\n"
    zygote = box._zygotes[("-I",)]
    os.kill(zygote.proc.pid, signal.SIGKILL)
    zygote.proc.wait()
    monkeypatch.setattr(type(zygote), "alive", property(lambda self: True))
    runs = box.zygote_runs
    assert box.run_python("print(3)").stdout == "3\n"
    assert box.zygote_runs == runs + 1 and box._zygotes[("-I",)] is not zygote
    assert live_sandbox_processes(box) == []
