"""Linux processes read from ``/proc``: who a process is, who started it, and ending them.

A process is named by ``PID:START`` (its start time in clock ticks since boot), which no later
process with a reused pid shares. Processes we may not read are skipped: they are not ours.
Where there is no ``/proc`` (macOS) every scan finds nothing (:data:`AVAILABLE` says so): the
callers then fall back to what works everywhere (the guard polls its owner's pid).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROC = Path("/proc")
AVAILABLE = (PROC / "self" / "stat").exists()
"""Whether this system has Linux's ``/proc``."""

CANNOT_START = "envhub guard: cannot start"
"""How the guard's stderr begins when its command could not be started (no such file, ...)."""
CANNOT_START_CODE = 127
"""The guard's exit status then (the shell's for a command not found)."""


@dataclass(frozen=True)
class Leftover:
    """A process an earlier owner left behind."""

    pid: int
    name: str
    """Its command line, shortened (``VLLM::EngineCore`` and the like are process titles)."""
    owner: str
    """The owner's ``PID:START`` tag."""


def _stat(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` from field 3 (the state) on, or ``None`` if there is no such process."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) "


def start_time(pid: int) -> str | None:
    """When ``pid`` started (clock ticks since boot, as text), or ``None`` if it is not running
    (a zombie, which has exited and waits for its parent, is not)."""
    fields = _stat(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return fields[19]  # field 22: starttime


def owner_tag(pid: int) -> str:
    """``PID:START`` of a running process."""
    return f"{pid}:{start_time(pid)}"


def alive(tag: str) -> bool:
    """Whether the process a ``PID:START`` tag names still runs (not a later one with its pid)."""
    pid, _, started = tag.partition(":")
    return pid.isdigit() and start_time(int(pid)) == started


def exists(pid: int) -> bool:
    """Whether a process with pid ``pid`` exists (a zombie, or another user's, included): the
    check that works without ``/proc``, for names that carry their maker's pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by someone else
        return True
    return True


def environment(pid: int) -> dict[str, str]:
    """``pid``'s environment as it started (empty when it cannot be read)."""
    try:
        raw = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs}


def command_line(pid: int, width: int = 100) -> str:
    """``pid``'s command line (its title, for processes that set one), at most ``width`` chars."""
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "?"
    text = raw.replace(b"\0", b" ").decode(errors="replace").strip() or "?"
    return text if len(text) <= width else text[: width - 3] + "..."


def pids() -> Iterator[int]:
    """Every running process's pid (none without ``/proc``)."""
    if not AVAILABLE:
        return
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            yield int(entry.name)


def descendants(*roots: int) -> dict[int, str]:
    """Every running process below any of ``roots`` in the process tree, with its start
    time (one scan of /proc)."""
    children: dict[int, list[int]] = {}
    started: dict[int, str] = {}
    for pid in pids():
        fields = _stat(pid)
        if fields is None or fields[0] in ("Z", "X"):
            continue
        children.setdefault(int(fields[1]), []).append(pid)  # field 4: the parent's pid
        started[pid] = fields[19]
    found: dict[int, str] = {}
    stack = [child for root in roots for child in children.get(root, [])]
    while stack:
        pid = stack.pop()
        if pid not in found:
            found[pid] = started[pid]
            stack.extend(children.get(pid, []))
    return found


def group_members(group: int) -> list[int]:
    """The running processes of process group ``group``."""
    found = []
    for pid in pids():
        fields = _stat(pid)
        if fields is not None and fields[0] not in ("Z", "X") and int(fields[2]) == group:
            found.append(pid)  # field 5: the process group
    return found


def shared_memory(pid: int) -> set[str]:
    """The ``/dev/shm`` entries ``pid`` maps (POSIX shared memory, named semaphores)."""
    try:
        maps = (PROC / str(pid) / "maps").read_text()
    except OSError:
        return set()
    return {
        line.split("/dev/shm/", 1)[1].removesuffix(" (deleted)")
        for line in maps.splitlines()
        if "/dev/shm/" in line and not line.endswith(" (deleted)")
    }


def mapped_by(targets: Iterable[int]) -> set[str]:
    """The ``/dev/shm`` entries any of ``targets`` maps."""
    return set().union(*(shared_memory(pid) for pid in targets))


def release_shared_memory(names: Iterable[str], besides: Iterable[int]) -> list[str]:
    """Unlink the ``/dev/shm`` entries ``names`` that no process but ``besides`` maps (a
    killed process cannot unlink its own); returns those unlinked."""
    ours = set(besides)
    others = mapped_by(pid for pid in pids() if pid not in ours)
    released = []
    for name in sorted(set(names) - others):
        try:
            os.unlink(f"/dev/shm/{name}")
        except OSError:
            continue  # already gone: it cleaned up after itself
        released.append(name)
    return released


def leftovers(folder: str, dir_env: str, owner_env: str) -> list[Leftover]:
    """Processes tagged ``dir_env=folder`` whose ``owner_env`` tag names a process that is gone."""
    found = []
    for pid in pids():
        env = environment(pid)
        owner = env.get(owner_env, "")
        if env.get(dir_env) == folder and owner and not alive(owner):
            found.append(Leftover(pid, command_line(pid), owner))
    return found


def read_listing(path: Path) -> tuple[str, list[list[Any]]] | None:
    """A reaper's listing: its owner's tag and its rows (``None`` if missing or unreadable)."""
    try:
        listing = json.loads(path.read_text())
        return str(listing["owner"]), list(listing["processes"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def listed_leftovers(listing: tuple[str, list[list[Any]]] | None) -> list[Leftover]:
    """The processes a reaper's ``listing`` (:func:`read_listing`) names that still run, if its
    owner is gone (none without a listing, or when it names a live owner)."""
    if listing is None or alive(listing[0]):
        return []
    owner, rows = listing
    return [
        Leftover(int(pid), command_line(int(pid)), owner)
        for pid, started, _ in rows
        if alive(f"{pid}:{started}")
    ]


def end_processes(targets: Iterable[int], grace: float = 5.0) -> None:
    """SIGTERM to each of ``targets``, then SIGKILL to those still running after ``grace`` s."""
    tags = {pid: owner_tag(pid) for pid in targets}
    for pid in tags:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(alive(tag) for tag in tags.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid, tag in tags.items():
        if alive(tag):
            _signal(pid, signal.SIGKILL)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass
