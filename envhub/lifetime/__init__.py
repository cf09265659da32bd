"""Nothing outlives a run: guarded child processes, and a sweep of what a killed run left.

Two parts, each enough alone for the common case and together for the rest:

- :func:`guarded` wraps a command in :mod:`envhub.lifetime.guard`, which ends the command's
  whole process group when any watched process (the caller, by default) dies, however it dies.
  vLLM servers run so, with their engine core and workers.
- :func:`owning` tags every process started under it (through the environment, which every
  descendant inherits, whatever group or session it moves to) with the run's folder and its
  owner, and starts a reaper (:mod:`envhub.lifetime.reaper`) that ends every tagged process
  once the owner dies, however it dies (Ray's agents, say, which outlive a killed driver by up
  to a minute). Before that it :func:`sweep`\\ s what an earlier owner of the same folder left:
  processes whose owner is gone (after a reaper that was itself killed, say). Each one ended is
  named in the log.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from envhub.lifetime import procs
from envhub.lifetime.procs import (
    Leftover,
    end_processes,
    leftovers,
    listed_leftovers,
    owner_tag,
    read_listing,
)

__all__ = [
    "LISTING",
    "OWNER_DIR_ENV",
    "OWNER_ENV",
    "REAPER",
    "Leftover",
    "guarded",
    "owning",
    "start_follower",
    "sweep",
]

log = logging.getLogger(__name__)

GUARD = Path(__file__).with_name("guard.py")
REAPER = Path(__file__).with_name("reaper.py")

OWNER_DIR_ENV = "ENVHUB_OWNER_DIR"
"""The folder of the run that started a process (inherited by its descendants)."""
OWNER_ENV = "ENVHUB_OWNER"
"""``PID:START`` of the run's driver: the sweep ends a tagged process only when that is gone."""
LISTING = ".envhub-processes.json"
"""The reaper's list of the run's processes, in the run's folder while it runs."""


def guarded(
    command: Sequence[str], watch: Sequence[int] | None = None, grace: float = 5.0
) -> list[str]:
    """``command`` run under the guard: its process group ends when any of ``watch`` (default:
    this process) dies. Start it with ``start_new_session=True``; stopping the guard (SIGTERM)
    ends the group after ``grace`` seconds at most."""
    pids = list(watch) if watch else [os.getpid()]
    flags = [arg for pid in pids for arg in ("--watch", str(pid))]
    return [sys.executable, "-s", str(GUARD), *flags, "--grace", f"{grace:g}", "--", *command]


@contextlib.contextmanager
def owning(folder: str | Path) -> Iterator[list[Leftover]]:
    """Tag every process started inside with ``folder`` and this process as their owner, after
    sweeping what an earlier owner of ``folder`` left; yields what was ended. The environment
    is restored on exit."""
    folder = str(Path(folder).resolve())
    ended = sweep(folder)
    tag = owner_tag(os.getpid())
    listing = Path(folder) / LISTING
    reaper = _start_reaper(tag, listing) if procs.AVAILABLE else None  # it reads /proc
    saved = {name: os.environ.get(name) for name in (OWNER_DIR_ENV, OWNER_ENV)}
    os.environ[OWNER_DIR_ENV] = folder
    os.environ[OWNER_ENV] = tag
    try:
        yield ended
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if reaper is not None:
            reaper.terminate()  # we are alive and cleaned up: it has nothing to do
            reaper.wait()
        listing.unlink(missing_ok=True)


def _start_reaper(tag: str, listing: Path) -> subprocess.Popen[bytes]:
    """The reaper of this process's, running and watching us, keeping ``listing``."""
    return start_follower(
        [sys.executable, "-s", str(REAPER), str(os.getpid()), tag, OWNER_ENV, str(listing)]
    )


def start_follower(argv: Sequence[str]) -> subprocess.Popen[bytes]:
    """Start ``argv``, a process that outlives us to clean up after us (a reaper), and wait
    for its ``ready`` line: from then on it follows us. It runs in a session of its own (a
    Ctrl-C or a kill of our group leaves it) and untagged (the run's own reaper must not end
    it before it has done its job)."""
    env = {k: v for k, v in os.environ.items() if k not in (OWNER_DIR_ENV, OWNER_ENV)}
    follower = subprocess.Popen(
        list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=env,
        start_new_session=True,
    )  # fmt: skip
    assert follower.stdout is not None
    follower.stdout.readline()  # "ready"
    follower.stdout.close()
    return follower


def sweep(folder: str | Path, grace: float = 5.0) -> list[Leftover]:
    """End what an earlier run of ``folder`` left whose owner is gone: the processes its reaper
    listed, and those tagged with ``folder`` (SIGTERM, then SIGKILL after ``grace`` s), each
    named in the log; returns them. Processes of a live owner are left alone."""
    folder = Path(folder).resolve()
    listing = read_listing(folder / LISTING)
    found = listed_leftovers(listing)
    found += [
        leftover
        for leftover in leftovers(str(folder), OWNER_DIR_ENV, OWNER_ENV)
        if leftover.pid not in {f.pid for f in found}
    ]
    for leftover in found:
        log.warning(
            "ending %s left by an earlier run of %s (pid %d, owner %s is gone)",
            leftover.name,
            folder,
            leftover.pid,
            leftover.owner,
        )
    end_processes([leftover.pid for leftover in found], grace)
    if listing is not None and not procs.alive(listing[0]):  # a live owner's stays its own
        (folder / LISTING).unlink(missing_ok=True)
    return found
