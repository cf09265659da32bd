"""End every process a run started once its driver is gone:
``python reaper.py PID TAG ENV LIST``.

Which processes are the run's: those below ``PID`` in the process tree, noted every
:data:`LOOK_EVERY_S` seconds while it lives (its death hands them to init, which erases the
link), and those carrying ``ENV=TAG`` in their environment (:func:`envhub.lifetime.owning` sets
it in the driver, so every descendant inherits it, whatever group or session it moves to;
a process that sets its title, as Ray's and vLLM's do, may blank it, hence both). Ray's agents,
for one, outlive a killed driver and its raylet by up to a minute on their own.

The reaper waits for ``PID`` to exit, however it exits, then ends each of them: SIGTERM, and
SIGKILL to those left after :data:`GRACE_S`, and unlinks the shared memory they held (a killed
process never unlinks its own). A SIGTERM to the reaper (the run ended well and
cleaned up itself) makes it exit without a sweep. Meanwhile it keeps the noted processes in the
JSON file ``LIST`` (``{"owner": TAG, "processes": [[pid, start, command], ...]}``), so that if
it is killed too, the next run of the folder still knows what to end
(:func:`envhub.lifetime.sweep`).

It imports only the standard library and :mod:`procs` (run as a file, not through ``envhub``).
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import procs  # noqa: E402 - a sibling file, not the envhub package (this runs as a file)

LOOK_EVERY_S = 1.0
"""How often the driver's process tree is noted (a scan of /proc: a few ms)."""
GRACE_S = 2.0
"""Seconds between SIGTERM and SIGKILL: nobody is left to wait for, and the memory is wanted."""


def follow(pid: int) -> int | None:
    """A pidfd of ``pid`` (readable once it exits); ``None`` when it has already exited or
    the kernel has no pidfds (then :func:`note_until_exit` polls)."""
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def note_until_exit(pid: int, fd: int | None, listing: Path, tag: str) -> dict[int, str]:
    """Note ``pid``'s descendants (pid -> start time) until it exits, kept in ``listing``;
    returns them all."""
    noted: dict[int, str] = {}
    while procs.start_time(pid) is not None:
        now = {p: t for p, t in noted.items() if procs.alive(f"{p}:{t}")}
        now.update(procs.descendants(pid))
        if now != noted:
            write_listing(listing, tag, now)
        noted = now
        if fd is not None:
            if select.select([fd], [], [], LOOK_EVERY_S)[0]:
                break
        else:
            time.sleep(LOOK_EVERY_S)
    return noted


def write_listing(path: Path, tag: str, noted: dict[int, str]) -> None:
    """``noted`` with each command line, in ``path``, replaced whole (a reader never sees half)."""
    rows = [[pid, started, procs.command_line(pid)] for pid, started in sorted(noted.items())]
    partial = path.with_name(path.name + ".partial")
    try:
        partial.write_text(json.dumps({"owner": tag, "processes": rows}))
        os.replace(partial, path)
    except OSError:
        pass  # a full disk or a removed folder: the tree and the tags still serve


def the_runs(noted: dict[int, str], env: str, tag: str) -> list[int]:
    """The run's running processes: noted (and still the same process), or tagged, and all
    below those; never this one."""
    found = {pid for pid, started in noted.items() if procs.alive(f"{pid}:{started}")}
    found |= {pid for pid in procs.pids() if procs.environment(pid).get(env) == tag}
    found |= set(procs.descendants(*found))
    found.discard(os.getpid())
    return sorted(found)


def release(writers: set[int], mapped: set[str]) -> None:
    """Unlink the shared memory the run's processes mapped and no live process maps, and the
    weights files its processes shared with their engines (``envhub-weights-PID-*.bin``,
    written, not mapped, by the driver or, with Megatron, by trainer rank 0, for each pid of
    ``writers``): nobody of the run is left to."""
    procs.release_shared_memory(mapped, besides=())
    for folder in {Path("/dev/shm"), Path(tempfile.gettempdir())}:
        for writer in writers:
            for path in folder.glob(f"envhub-weights-{writer}-*.bin"):
                path.unlink(missing_ok=True)


def main() -> None:
    """The command line (see the module's docstring)."""
    pid, tag, env, listing = int(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4])
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is for the run, which cleans up
    fd = follow(pid)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    noted = note_until_exit(pid, fd, listing, tag)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # from here on, finish the sweep
    mapped: set[str] = set()
    ended = {pid, *noted}
    # Twice: a process that was starting a child when the first pass ended it may have left one.
    for _ in range(2):
        targets = the_runs(noted, env, tag)
        mapped |= procs.mapped_by(targets)
        ended |= set(targets)
        procs.end_processes(targets, GRACE_S)
    release(ended, mapped)
    listing.unlink(missing_ok=True)  # all ended: nothing for the next run to sweep


if __name__ == "__main__":
    main()
