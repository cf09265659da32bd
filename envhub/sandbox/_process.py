"""Process plumbing for the local backend: run an argv with capped output and a deadline,
hand out sandbox uids, and wait until a uid owns no process any more."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from envhub.errors import SandboxError

_CHUNK = 1 << 16


@dataclass
class Outcome:
    """What :func:`execute` saw: raw output, status and how it ended."""

    stdout: bytes
    stderr: bytes
    channel: bytes
    exit_code: int | None
    killed_for: str | None
    """``timeout`` or ``output_limit`` when this side killed the process, else ``None``."""
    seconds: float
    sandbox_init: int | None = None
    """The host pid of the sandbox's pid 1 (bubblewrap runs only), once it was known."""


class _Capped:
    """Reads a stream, keeping at most ``cap`` bytes; ``over`` is set once more arrives."""

    def __init__(
        self, stream: asyncio.StreamReader | None, cap: int, on_over: asyncio.Event
    ) -> None:
        self.stream, self.cap, self.on_over = stream, cap, on_over
        self.data = bytearray()

    async def drain(self) -> None:
        if self.stream is None:
            return
        # Read to the end even past the cap (discarding): asyncio only reports the process
        # as finished once every pipe is closed, and a paused pipe never closes.
        while chunk := await self.stream.read(_CHUNK):
            room = self.cap - len(self.data)
            if room > 0:
                self.data += chunk[:room]
            if len(chunk) > room:
                self.on_over.set()


async def _feed(proc: asyncio.subprocess.Process, data: bytes) -> None:
    assert proc.stdin is not None
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        if data:
            proc.stdin.write(data)
            await proc.stdin.drain()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        proc.stdin.close()


async def _read_channel(fd: int, cap: int) -> bytes:
    """Read a pipe's read end to EOF in a thread (at most ``cap`` bytes kept)."""

    def read() -> bytes:
        data = bytearray()
        with os.fdopen(fd, "rb", buffering=0) as f:
            while chunk := f.read(_CHUNK):
                if len(data) < cap:
                    data += chunk[: cap - len(data)]
        return bytes(data)

    return await asyncio.to_thread(read)


async def execute(
    argv: Sequence[str],
    *,
    stdin: bytes,
    output_cap: int,
    deadline: float,
    pass_fds: Sequence[int] = (),
    channel_fd: int | None = None,
    channel_cap: int = 0,
    cwd: str | None = None,
    new_session: bool = False,
) -> Outcome:
    """Run ``argv``; kill it (SIGKILL to the direct child) at ``deadline`` seconds or when a
    stream passes ``output_cap`` bytes. ``channel_fd`` is the read end of an extra pipe whose
    write end the child holds in ``pass_fds``; it is read to EOF alongside."""
    started = time.perf_counter()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            pass_fds=tuple(pass_fds),
            cwd=cwd,
            start_new_session=new_session,
        )
    except OSError as e:
        raise SandboxError(f"cannot start {argv[0]}: {e}") from e
    finally:
        for fd in pass_fds:
            os.close(fd)
    over = asyncio.Event()
    out, err = _Capped(proc.stdout, output_cap, over), _Capped(proc.stderr, output_cap, over)
    channel = (
        asyncio.ensure_future(_read_channel(channel_fd, channel_cap))
        if channel_fd is not None
        else None
    )
    work = asyncio.gather(out.drain(), err.drain(), _feed(proc, stdin), proc.wait())
    watch = asyncio.ensure_future(over.wait())
    killed_for = None
    try:
        done, _ = await asyncio.wait(
            {work, watch}, timeout=deadline, return_when=asyncio.FIRST_COMPLETED
        )
        if work not in done:
            killed_for = "output_limit" if watch in done else "timeout"
            _kill(proc, new_session)
            await _reap(proc)
        await proc.wait()
    except BaseException:  # cancelled (or worse): never leave the sandbox behind
        _kill(proc, new_session)
        raise
    finally:
        watch.cancel()
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await work
    channel_data = await channel if channel is not None else b""
    exit_code = None if killed_for else _status(proc.returncode)
    return Outcome(
        bytes(out.data),
        bytes(err.data),
        channel_data,
        exit_code,
        killed_for,
        time.perf_counter() - started,
    )


def _status(returncode: int | None) -> int | None:
    """asyncio gives ``-n`` for death by signal n; report it as a shell does: ``128 + n``."""
    if returncode is None:
        return None
    return 128 - returncode if returncode < 0 else returncode


def _kill(proc: asyncio.subprocess.Process, group: bool) -> None:
    """Kill a run. For bubblewrap, kill the namespace's init (the child of the outer bwrap)
    first: the kernel then kills everything in the namespace and the outer bwrap reaps it and
    exits. Killing the outer bwrap alone would orphan that init as a zombie for the host's
    pid 1 to reap, whenever it gets to it."""
    with contextlib.suppress(ProcessLookupError):
        if group:
            os.killpg(proc.pid, 9)
            return
        children = _children(proc.pid)
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        if not children:
            proc.kill()


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


async def _reap(proc: asyncio.subprocess.Process, grace: float = 2.0) -> None:
    """Wait for a killed run; SIGKILL the direct child too if it lingers."""
    try:
        await asyncio.wait_for(proc.wait(), grace)
    except (asyncio.TimeoutError, TimeoutError):
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


def uid_processes(uid: int, *, live: bool = False) -> list[int]:
    """Pids of the processes whose real uid is ``uid`` (read from ``/proc``); with ``live``,
    without zombies (dead, waiting for their parent to collect their status)."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", "rb") as f:
                zombie = False
                for line in f:
                    if line.startswith(b"State:"):
                        zombie = line.split()[1] == b"Z"
                    elif line.startswith(b"Uid:"):
                        if int(line.split()[1]) == uid and not (live and zombie):
                            pids.append(int(entry.name))
                        break
        except (OSError, ValueError):  # the process ended while we looked
            continue
    return pids


async def wait_uid_gone(uid: int, timeout: float = 10.0) -> None:
    """Wait until ``uid`` owns no process (after a kill, the kernel tears a sandbox's pid
    namespace down asynchronously); kill stragglers directly when it takes long."""
    stop = time.monotonic() + timeout
    while pids := uid_processes(uid):
        if time.monotonic() > stop:
            raise SandboxError(
                f"sandbox uid {uid} still owns processes {pids[:5]} after {timeout:g} s"
            )
        if time.monotonic() > stop - timeout / 2:
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, 9)
        await asyncio.sleep(0.005)


class UidPool:
    """Hands out ``size`` uids from ``base`` upwards that no other process holds (see
    :func:`_claim`), one per concurrent run, across threads and event loops: RLIMIT_NPROC
    counts per uid, so runs that shared a uid would share a limit. ``step=0`` repeats the one
    uid ``base`` (a concurrency bound only)."""

    def __init__(self, base: int, size: int, step: int = 1) -> None:
        self.base, self.size = base, size
        self.uids: tuple[int, ...] = tuple(_claim(base, size) if step else [base] * size)
        self._free = list(reversed(self.uids))
        self._lock = threading.Lock()

    async def acquire(self) -> int:
        delay = 0.001
        while True:
            with self._lock:
                if self._free:
                    return self._free.pop()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.02)

    def release(self, uid: int) -> None:
        with self._lock:
            self._free.append(uid)


CLAIMS = Path(tempfile.gettempdir()) / "envhub-sandbox-uids"
"""One lock file per uid in use: other processes on the machine skip uids locked here."""
_CLAIM_RANGE = 4096


def _claim(base: int, size: int) -> list[int]:
    """``size`` uids from ``base`` upwards that no other process holds, each held by a lock on
    a file in :data:`CLAIMS` for as long as this process lives (the kernel drops the locks
    when it dies, however it dies)."""
    CLAIMS.mkdir(mode=0o700, exist_ok=True)
    uids: list[int] = []
    for uid in range(base, base + _CLAIM_RANGE):
        fd = os.open(CLAIMS / f"{uid}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        _HELD.append(fd)
        uids.append(uid)
        if len(uids) == size:
            return uids
    raise SandboxError(
        f"no {size} free sandbox uids in {base}..{base + _CLAIM_RANGE - 1}; "
        "other envhub processes hold them"
    )


_HELD: list[int] = []
_POOLS: dict[tuple[int, int, int], UidPool] = {}
_POOLS_LOCK = threading.Lock()


def uid_pool(base: int, size: int, step: int = 1) -> UidPool:
    """The process-wide pool for a uid range (sandboxes with the same range share it)."""
    with _POOLS_LOCK:
        if (base, size, step) not in _POOLS:
            _POOLS[base, size, step] = UidPool(base, size, step)
        return _POOLS[base, size, step]
