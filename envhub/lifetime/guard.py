"""Run a command that dies with its owners: ``python guard.py --watch PID [--watch PID] -- CMD``.

The guard leads a process group of its own and starts ``CMD`` in it; whatever ``CMD`` starts
(vLLM's engine core and workers, a program's children) joins the group. When any watched
process ends, however it ends (SIGKILL included, which no handler sees), the guard sends the
group SIGTERM, waits up to :data:`ORPHAN_GRACE_S` seconds and then SIGKILLs all of it, itself
last. When ``CMD`` ends on its own the guard ends what is left of the group the same way, then
exits with its status (a signal as the same signal). A SIGTERM (or SIGINT, SIGHUP) to the
guard ends the group the same way, after up to ``--grace`` seconds, so stopping the group's
leader stops everything and one place sends the signals (the guard then exits by its own
SIGKILL).

Before the SIGKILL the guard unlinks the ``/dev/shm`` entries its group maps and no process
outside it does: a killed process never unlinks its own (vLLM left a pair of 160 and 240 MiB
segments and a semaphore per killed engine before).

A watched process is followed through a pidfd (Linux 5.3+: no polling, no race with a reused
pid) or, where there is none, by polling it. The guard imports only the standard library and
its sibling :mod:`procs`: it is run as a file, not through ``envhub``, so it costs a bare
interpreter (~13 MB).
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import procs  # noqa: E402 - a sibling file, not the envhub package (this runs as a file)

POLL_S = 0.2
"""How often the guard looks at its command when nothing else wakes it."""

ORPHAN_GRACE_S = 2.0
"""The most the group gets between SIGTERM and SIGKILL once an owner is gone: nobody is left
to wait for a graceful exit, and the memory it holds is wanted."""


def _watch(pid: int) -> int | None:
    """A pidfd for ``pid`` (readable once it exits), or ``None`` where pidfds do not exist.

    Raises:
        ProcessLookupError: ``pid`` is not running.
    """
    if not hasattr(os, "pidfd_open"):
        os.kill(pid, 0)
        return None
    try:
        return os.pidfd_open(pid)
    except OSError as e:
        if isinstance(e, ProcessLookupError):
            raise
        os.kill(pid, 0)  # pidfds unsupported by this kernel: poll instead
        return None


class _Stop:
    """Set by SIGTERM/SIGINT/SIGHUP: stop the command, then exit as it did."""

    requested = False

    @classmethod
    def handle(cls, signum: int, frame: object) -> None:
        cls.requested = True


def _releasable(members: list[int]) -> set[str]:
    """The shared memory ``members`` map that the guard may unlink once they are killed: not
    envhub's own files (the weights a trainer shares with its engines), which are the trainer's
    to remove: it may outlive this engine, and it sweeps its own leftovers."""
    return {name for name in procs.mapped_by(members) if not name.startswith("envhub-")}


def end_group(child: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM to the guard's group, ``grace`` seconds for ``child`` to exit, then SIGKILL to
    whatever of the group is left (the guard included, so this may not return). The shared
    memory the group mapped and did not release (vLLM's, when it is killed) is unlinked first:
    no process of the group will ever unlink it."""
    group = os.getpgrp()
    mapped = _releasable([pid for pid in procs.group_members(group) if pid != os.getpid()])
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.killpg(group, signal.SIGTERM)
    try:
        child.wait(grace)
    except subprocess.TimeoutExpired:
        pass
    procs.release_shared_memory(mapped, besides=procs.group_members(group))
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.killpg(group, signal.SIGKILL)


def end_rest(grace: float) -> None:
    """End what is left of the group once the command has exited on its own (vLLM's engine
    core outlives an API server that crashed): SIGTERM, SIGKILL after ``grace`` s, and the
    shared memory they mapped released."""
    me, group = os.getpid(), os.getpgrp()
    rest = [pid for pid in procs.group_members(group) if pid != me]
    if not rest:
        return
    mapped = _releasable(rest)
    procs.end_processes(rest, grace)
    procs.release_shared_memory(mapped, besides=())


def exit_as(returncode: int) -> None:
    """Exit as the command did: its code, or killed by the same signal."""
    if returncode < 0:
        if -returncode not in (signal.SIGKILL, signal.SIGSTOP):  # those take no handler
            signal.signal(-returncode, signal.SIG_DFL)
        os.kill(os.getpid(), -returncode)
    sys.exit(returncode if returncode >= 0 else 128 - returncode)


def run(command: Sequence[str], watched: Sequence[int], grace: float) -> None:
    """Guard ``command`` while every ``watched`` process lives (see the module's docstring)."""
    if os.getpgrp() != os.getpid():
        os.setsid()  # a group of our own, so ending it never reaches the caller's
    try:
        fds = {pid: _watch(pid) for pid in watched}
    except ProcessLookupError:
        sys.exit(f"envhub guard: a watched process ({list(watched)}) is already gone")
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _Stop.handle)
    try:
        child = subprocess.Popen(list(command))
    except OSError as e:  # said as the caller would say it had it started the command itself
        print(f"{procs.CANNOT_START} {command[0]}: {e}", file=sys.stderr, flush=True)
        sys.exit(procs.CANNOT_START_CODE)
    polled = [pid for pid, fd in fds.items() if fd is None]
    owners = [fd for fd in fds.values() if fd is not None]
    # The command's own pidfd wakes us the moment it exits (a short command, a harness
    # program, is not kept waiting for the next poll).
    child_fd = _watch(child.pid) if owners else None
    readable = owners + ([child_fd] if child_fd is not None else [])
    while True:
        ready = select.select(readable, [], [], POLL_S)[0] if readable else []
        if not readable:
            time.sleep(POLL_S)
        owner_died = any(fd in ready for fd in owners)
        owner_died = owner_died or not all(procs.exists(pid) for pid in polled)
        if child.poll() is not None:
            end_rest(min(grace, ORPHAN_GRACE_S))
            exit_as(child.returncode)
        if owner_died or _Stop.requested:
            end_group(child, grace if _Stop.requested else min(grace, ORPHAN_GRACE_S))
            exit_as(child.returncode if child.returncode is not None else -signal.SIGKILL)


def main(argv: Sequence[str] | None = None) -> None:
    """The command line (see the module's docstring)."""
    parser = argparse.ArgumentParser(prog="envhub-guard")
    parser.add_argument("--watch", type=int, action="append", required=True)
    parser.add_argument("--grace", type=float, default=5.0)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")
    run(command, args.watch, args.grace)


if __name__ == "__main__":
    main()
