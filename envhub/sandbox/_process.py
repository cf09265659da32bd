"""Process plumbing for the local backend: run an argv with capped output and a deadline, read
the sandbox init's host pid that bubblewrap reports, and wait until a uid owns no process any
more. (Which uid a run gets: :mod:`envhub.sandbox.uids`.)"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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


def spawn(
    argv: Sequence[str],
    *,
    pass_fds: Sequence[int] = (),
    cwd: str | None = None,
    new_session: bool = False,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` with pipes for stdin, stdout and stderr (the child inherits
    ``pass_fds``, closed here once it has them). Not tied to an event loop: :func:`drive` runs
    it later on whichever loop the caller has, so a process can be started ahead of its use."""
    try:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=tuple(pass_fds),
            cwd=cwd,
            start_new_session=new_session,
        )
    except OSError as e:
        raise SandboxError(f"cannot start {argv[0]}: {e}") from e
    finally:
        for fd in pass_fds:
            os.close(fd)


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
    """Run ``argv`` (:func:`spawn`, then :func:`drive`)."""
    started = time.perf_counter()
    proc = spawn(argv, pass_fds=pass_fds, cwd=cwd, new_session=new_session)
    return await drive(
        proc,
        stdin=stdin,
        output_cap=output_cap,
        deadline=deadline,
        channel_fd=channel_fd,
        channel_cap=channel_cap,
        new_session=new_session,
        started=started,
    )


async def drive(
    proc: subprocess.Popen[bytes],
    *,
    stdin: bytes,
    output_cap: int,
    deadline: float,
    feeds: Sequence[tuple[int, bytes]] = (),
    channel_fd: int | None = None,
    channel_cap: int = 0,
    new_session: bool = False,
    started: float | None = None,
) -> Outcome:
    """Feed a :func:`spawn`-ed process ``stdin`` (and each ``(fd, data)`` of ``feeds``: write
    ends of other pipes it reads, closed after), collect its output and wait for it; kill it
    (SIGKILL to the direct child) at ``deadline`` seconds or when a stream passes
    ``output_cap`` bytes. ``channel_fd`` is the read end of an extra pipe the child writes; it
    is read to EOF alongside (at most ``channel_cap`` bytes kept). Every fd given is closed on
    return."""
    started = time.perf_counter() if started is None else started
    run = _Run(asyncio.get_running_loop(), proc, output_cap)
    for fd, _ in feeds:
        run.own(fd, functools.partial(os.close, fd))
    channel = bytearray()
    reads = [run.read(run.stdout_fd, run.stdout), run.read(run.stderr_fd, run.stderr)]
    if channel_fd is not None:
        run.own(channel_fd, functools.partial(os.close, channel_fd))
        reads.append(run.read(channel_fd, channel, channel_cap, stops_run=False))
    killed_for = None
    work = asyncio.gather(
        *reads,
        *[run.write(fd, data) for fd, data in feeds],
        run.write(run.stdin_fd, stdin),
        run.exited(),
    )
    try:
        done, _ = await asyncio.wait(
            {work, run.over}, timeout=deadline, return_when=asyncio.FIRST_COMPLETED
        )
        if work not in done:
            killed_for = "output_limit" if run.over in done else "timeout"
            kill(proc, new_session)
            await _reap(run)
        await run.exited()
    except BaseException:  # cancelled (or worse): never leave the sandbox behind
        kill(proc, new_session)
        _reap_later(proc)
        raise
    finally:
        run.close()
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await work
    exit_code = None if killed_for else _status(proc.returncode)
    return Outcome(
        bytes(run.stdout),
        bytes(run.stderr),
        bytes(channel),
        exit_code,
        killed_for,
        time.perf_counter() - started,
    )


class _Run:
    """One process's pipes and exit on an event loop, by ``add_reader``/``add_writer`` on the
    raw fds and a pidfd (no asyncio transports, so the process need not have been started on
    this loop). Output past ``cap`` bytes is read and dropped (``over`` is set): a pipe left
    unread would block the writer and never close."""

    def __init__(self, loop: asyncio.AbstractEventLoop, proc: subprocess.Popen[bytes], cap: int):
        self.loop, self.proc, self.cap = loop, proc, cap
        self.stdout, self.stderr = bytearray(), bytearray()
        self.over: asyncio.Future[None] = loop.create_future()
        self._exit: asyncio.Future[None] | None = None
        self._watched: list[tuple[str, int]] = []
        self._owned: dict[int, Callable[[], object]] = {}
        streams = (proc.stdin, proc.stdout, proc.stderr)
        assert all(streams), "drive() needs a process from spawn()"
        self.stdin_fd, self.stdout_fd, self.stderr_fd = (s.fileno() for s in streams)  # type: ignore[union-attr]
        for stream in streams:  # closed here, once (never as a bare fd: its number is reused)
            self.own(stream.fileno(), stream.close)  # type: ignore[union-attr]
        proc.stdin = proc.stdout = proc.stderr = None

    def own(self, fd: int, closer: Callable[[], object]) -> None:
        """Close ``fd`` with ``closer`` when done with it, or at :meth:`close`."""
        self._owned[fd] = closer

    def read(
        self, fd: int, into: bytearray, cap: int | None = None, stops_run: bool = True
    ) -> asyncio.Future[None]:
        """Read ``fd`` to end-of-file into ``into``, keeping at most ``cap`` bytes (default:
        the output cap); past it ``over`` is set when ``stops_run``, else the rest is dropped."""
        cap = self.cap if cap is None else cap
        done = self.loop.create_future()
        os.set_blocking(fd, False)

        def readable() -> None:
            try:
                chunk = os.read(fd, _CHUNK)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                self._unwatch("r", fd)
                self._close(fd)
                if not done.done():
                    done.set_result(None)
                return
            room = cap - len(into)
            if room > 0:
                into.extend(chunk[:room])
            if stops_run and len(chunk) > room and not self.over.done():
                self.over.set_result(None)

        self._watch("r", fd, readable)
        return done

    def write(self, fd: int, data: bytes) -> asyncio.Future[None]:
        """Write ``data`` to ``fd``, then close it (a reader that went away ends the write)."""
        done = self.loop.create_future()
        view = memoryview(data)
        os.set_blocking(fd, False)

        def finish() -> None:
            self._unwatch("w", fd)
            self._close(fd)
            if not done.done():
                done.set_result(None)

        def writable() -> None:
            nonlocal view
            try:
                while view:
                    view = view[os.write(fd, view) :]
            except BlockingIOError:
                return
            except OSError:  # the reader closed its end (or exited)
                pass
            finish()

        writable()
        if not done.done():
            self._watch("w", fd, writable)
        return done

    def exited(self) -> asyncio.Future[None]:
        """Done once the process has exited and been reaped (``proc.returncode`` is set)."""
        if self._exit is not None:
            return self._exit
        self._exit = self.loop.create_future()
        try:
            pidfd = os.pidfd_open(self.proc.pid)
        except OSError:  # no pidfd (Linux < 5.3): a thread waits instead
            waiter = self.loop.run_in_executor(None, self.proc.wait)
            waiter.add_done_callback(lambda _: self._exited())
            return self._exit
        self.own(pidfd, functools.partial(os.close, pidfd))

        def readable() -> None:  # stays readable once the process has exited: stop watching
            if self.proc.poll() is not None:
                self._unwatch("r", pidfd)
                self._exited()

        self._watch("r", pidfd, readable)
        return self._exit

    def _exited(self) -> None:
        assert self._exit is not None
        if not self._exit.done():
            self._exit.set_result(None)

    def _watch(self, kind: str, fd: int, callback: Callable[[], object]) -> None:
        (self.loop.add_reader if kind == "r" else self.loop.add_writer)(fd, callback)
        self._watched.append((kind, fd))

    def _unwatch(self, kind: str, fd: int) -> None:
        if (kind, fd) in self._watched:
            self._watched.remove((kind, fd))
            (self.loop.remove_reader if kind == "r" else self.loop.remove_writer)(fd)

    def _close(self, fd: int) -> None:
        closer = self._owned.pop(fd, None)
        if closer is not None:
            with contextlib.suppress(OSError):
                closer()

    def close(self) -> None:
        """Stop watching and close every fd still open (the process's pipes included)."""
        for kind, fd in list(self._watched):
            self._unwatch(kind, fd)
        for fd in list(self._owned):
            self._close(fd)


def _status(returncode: int | None) -> int | None:
    """asyncio gives ``-n`` for death by signal n; report it as a shell does: ``128 + n``."""
    if returncode is None:
        return None
    return 128 - returncode if returncode < 0 else returncode


def kill(proc: subprocess.Popen[bytes], group: bool) -> None:
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


async def _reap(run: _Run, grace: float = 2.0) -> None:
    """Wait for a killed run; SIGKILL the direct child too if it lingers."""
    try:
        await asyncio.wait_for(asyncio.shield(run.exited()), grace)
    except (asyncio.TimeoutError, TimeoutError):
        with contextlib.suppress(ProcessLookupError):
            run.proc.kill()
        await run.exited()


def _reap_later(proc: subprocess.Popen[bytes], grace: float = 2.0) -> None:
    """Reap a killed process on a thread (the loop may be going away): a child never waited
    for stays a zombie, which still counts as a process of its uid."""

    def reap() -> None:
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()

    threading.Thread(target=reap, name="envhub-sandbox-reap", daemon=True).start()


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


def sandbox_init(info_fd: int) -> int | None:
    """The host pid of the sandbox's init from bubblewrap's ``--info-fd`` JSON (written before
    the command starts), or ``None`` when bubblewrap wrote none (it failed to start)."""
    os.set_blocking(info_fd, False)
    try:
        return _child_pid(os.read(info_fd, 1 << 16))
    except OSError:
        return None


def _child_pid(info: bytes) -> int | None:
    """The ``child-pid`` of bubblewrap's info JSON; ``None`` until the JSON is whole."""
    try:
        return int(json.loads(info)["child-pid"])
    except (ValueError, KeyError, TypeError):
        return None


def _resolve(future: asyncio.Future[None]) -> None:
    """Resolve ``future`` once (a reader callback may fire again before it is removed)."""
    if not future.done():
        future.set_result(None)


async def await_sandbox_init(info_fd: int, wait: float) -> int | None:
    """:func:`sandbox_init` once bubblewrap has written all of its JSON (in several writes),
    waiting up to ``wait`` seconds without blocking the event loop."""
    loop = asyncio.get_running_loop()
    os.set_blocking(info_fd, False)
    data, deadline = b"", loop.time() + wait
    while True:
        try:
            chunk = os.read(info_fd, 1 << 16)
        except BlockingIOError:
            chunk = None
        except OSError:
            return None
        data += chunk or b""
        if (pid := _child_pid(data)) is not None:
            return pid
        if chunk == b"" or loop.time() >= deadline:  # EOF, or out of time
            return None
        readable = loop.create_future()
        loop.add_reader(info_fd, _resolve, readable)
        try:
            await asyncio.wait_for(readable, deadline - loop.time())
        except asyncio.TimeoutError:
            return None
        finally:
            loop.remove_reader(info_fd)
