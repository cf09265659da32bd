"""The local backend's session: one bubblewrap sandbox for an episode, with its own uid.

A :class:`LocalSession` takes a uid of its :class:`~envhub.sandbox.LocalSandbox`'s pool for its
whole life (so ``max_concurrency`` bounds live sessions and runs together), has the launcher
(:mod:`envhub.sandbox.session_launcher`) mount its files (a tmpfs of ``disk_mb`` in a mount
namespace of its own, holding an overlay on the workspace) and start bubblewrap with the jail's
flags (:func:`~envhub.sandbox.jail.bwrap_argv`), then waits for its init
(:mod:`envhub.sandbox.session_init`), which forks each call's command. The folders of its
:class:`~envhub.sandbox.session.SessionPaths` are bound from the same tmpfs: the working
folder again at each ``workdir`` path, an empty folder of the launcher's at each of
``folders``. The init is the sandbox's pid 1: compiled (:mod:`envhub.sandbox.session_init_c`)
where the system's ``cc`` could build it, else in Python. The Python init, as root with
zygotes on (the default), is instead forked into the started sandbox by a zygote of session
inits, as a zygote run is (:mod:`envhub.sandbox.zygote`), with a real uid that no call has
(:func:`~envhub.sandbox.uids.keeper_uid`), rather than starting an interpreter of its own
(~10 ms). No call can kill the init either way. The sandbox starts on first use.

What a session adds to the threat model: see :mod:`envhub.sandbox.threat_model`. The end:
:meth:`LocalSession.aclose` SIGKILLs the sandbox's pid 1 (the kernel then kills every process
of its pid namespace, and the mount namespace with the session's files goes with bubblewrap);
if envhub dies instead, the launcher kills every bubblewrap it started, and the uid's claim
lapses with envhub (:mod:`envhub.sandbox.uids`).

Local sessions need root (the mounts, and a uid of their own for the process limit).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import shutil
import signal
import socket
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from envhub.errors import ConfigError, SandboxError, SandboxUnavailableError
from envhub.sandbox import _process, netns
from envhub.sandbox import zygote as zygotes
from envhub.sandbox._pipes import CallPipes
from envhub.sandbox.base import (
    WORKDIR,
    Command,
    ExecResult,
    Limits,
    as_argv,
    as_bytes,
    classify_exit,
)
from envhub.sandbox.jail import ENV, Isolation, Jail, bwrap_argv
from envhub.sandbox.session import Session, SessionPaths, Workspace
from envhub.sandbox.session_channel import KILL_WAIT, ExitWatch, end_call, receive, send_run
from envhub.sandbox.session_init import (
    COMPILED_PATH,
    INIT,
    INIT_LOADER,
    INIT_NAME,
    INIT_VARIABLE,
    JOINED_INIT,
    KILLALL,
    kill_message,
    parse_reply,
    scratch_flags,
)
from envhub.sandbox.session_init_c import compiled_init
from envhub.sandbox.session_launcher import FDS, MOUNT_POINT, launcher
from envhub.sandbox.uids import keeper_uid

if TYPE_CHECKING:
    from envhub.sandbox.uids import UidPool

Start = Literal["overlay", "copy"]
_START_WAIT = 30.0


@dataclass
class _Running:
    """What a started session holds on the host (kept apart from the session object, so that
    a finalizer can end it when the session is dropped unclosed)."""

    bwrap: int
    """bubblewrap's pid (the launcher's child: not waitable here)."""
    pidfd: int
    """A pidfd of bubblewrap: readable once it has exited."""
    errors: int
    """The read end of bubblewrap's stderr (its errors, and the launcher's)."""
    uid: int
    control: socket.socket
    init_pid: int | None = None
    """The host pid of the sandbox's pid 1."""
    server_pid: int | None = None
    """The host pid of the session's init when a zygote forked it (pid 2 in the sandbox)."""


class LocalHost(Protocol):
    """What a :class:`LocalSession` uses of the sandbox that starts it: a
    :class:`~envhub.sandbox.LocalSandbox` (whose module imports this one, never the reverse)."""

    jail: Jail
    uids: UidPool
    zygote: bool
    python: str

    @property
    def isolation(self) -> Isolation:
        """How runs are confined: a session needs ``"bwrap"``."""
        ...

    @property
    def as_root(self) -> bool:
        """Whether envhub runs as root: a session needs it."""
        ...

    def session_path_problem(self, path: str) -> str | None:
        """Why a session cannot show a folder at ``path``, or ``None``."""
        ...

    async def _acquire(self) -> int:
        """A uid of the pool, waiting for one."""
        ...

    async def _release(self, uid: int, sandbox_init: int | None) -> None:
        """Give ``uid`` back once its processes (and ``sandbox_init``) are gone."""
        ...


class LocalSession(Session):
    """One episode's bubblewrap sandbox (see the module docstring). Made by
    :meth:`LocalSandbox.session <envhub.sandbox.LocalSandbox.session>`.

    Args:
        sandbox: The local sandbox whose jail, uid pool and Python it uses.
        workspace: What ``/sandbox`` starts as (empty when ``None``).
        limits: The limits of every call and of the session.
        start: ``"overlay"`` (copy-on-write over the workspace) or ``"copy"`` (a copy of it,
            made when the session starts; for comparison).
        paths: More folders it shows (where the sandbox's
            :meth:`~envhub.sandbox.LocalSandbox.session_path_problem` has none).

    Raises:
        SandboxUnavailableError: Not root, or the ``rlimits`` fallback.
        ConfigError: A path of ``paths`` that a sandbox cannot show (the reason named).
    """

    writable_roots: tuple[str, ...] = (WORKDIR, "/tmp", "/dev")
    """The session's tmpfs, bound at ``/sandbox`` and ``/tmp`` (and at its
    :attr:`~envhub.sandbox.session.SessionPaths.folders`), and its own ``/dev`` (a tmpfs of
    bubblewrap's, ``/dev/shm`` in it); the rest of its root is read-only (see
    :mod:`envhub.sandbox.jail`). The working folder's other paths are ``/sandbox`` again."""

    def __init__(
        self,
        sandbox: LocalHost,
        workspace: Workspace | None,
        limits: Limits,
        start: Start = "overlay",
        paths: SessionPaths | None = None,
    ) -> None:
        if not sandbox.as_root or sandbox.isolation != "bwrap":
            raise SandboxUnavailableError(
                "local sessions need envhub to run as root with bubblewrap (they mount the "
                "session's files and give it a uid of its own); use the e2b backend elsewhere"
            )
        if start not in ("overlay", "copy"):
            raise ValueError(f"start must be 'overlay' or 'copy', got {start!r}")
        self.paths = paths or SessionPaths()
        for path in self.paths.all:
            problem = sandbox.session_path_problem(path)
            if problem:
                raise ConfigError(f"a local session cannot show {path}: {problem}")
        self.writable_roots = (*type(self).writable_roots, *self.paths.folders)
        self.sandbox, self.workspace, self.limits, self.start = sandbox, workspace, limits, start
        self._running: _Running | None = None
        self._closed = False
        self._calls = 0
        self._lock: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None
        self._finalizer: weakref.finalize | None = None  # type: ignore[type-arg]

    @property
    def uid(self) -> int | None:
        """The session's uid on the host, once started."""
        return self._running.uid if self._running else None

    async def arun(
        self,
        command: Command,
        *,
        stdin: str | bytes | None = None,
        wall_time: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        """Run ``command`` in the session (see :meth:`Session.arun`)."""
        limits = self.call_limits(wall_time)
        out, err, code, killed_for, seconds = await self._call(
            as_argv(command), as_bytes(stdin or b""), env or {}, limits, limits.output_bytes
        )
        stdout, stderr = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
        reason = killed_for or classify_exit(code if code is not None else 0, stderr)
        return ExecResult(stdout, stderr, code, reason, seconds)  # type: ignore[arg-type]

    async def _run_helper(self, argv: list[str], stdin: bytes | None, cap: int) -> ExecResult:
        limits = self.limits.with_(wall_time=max(self.limits.wall_time, 30.0))
        out, err, code, killed_for, seconds = await self._call(argv, stdin or b"", {}, limits, cap)
        stderr = err.decode("utf-8", "replace")
        reason = killed_for or classify_exit(code if code is not None else 0, stderr)
        stdout = out.decode("utf-8", "surrogateescape")
        return ExecResult(stdout, stderr, code, reason, seconds)  # type: ignore[arg-type]

    def processes(self) -> list[int]:
        """Host pids of the session's live processes but its init and bubblewrap's: what
        calls left running (empty before the session starts and after it ends)."""
        running = self._running
        if running is None:
            return []
        own = {running.init_pid, running.server_pid, running.bwrap}
        return [pid for pid in _process.uid_processes(running.uid, live=True) if pid not in own]

    async def akill_processes(self) -> None:
        """SIGKILL every process the session's calls left running (the session stays usable),
        and wait until they are gone."""
        async with self._serialized():
            if self._running is None:
                return
            self._running.control.send(KILLALL)
            deadline = time.monotonic() + KILL_WAIT
            while self.processes():
                if time.monotonic() > deadline:
                    raise SandboxError(f"processes {self.processes()[:5]} outlived a kill")
                await asyncio.sleep(0.002)

    def kill_processes(self) -> None:
        """Synchronous :meth:`akill_processes`."""
        from envhub._async import run_sync

        run_sync(self.akill_processes())

    async def aclose(self) -> None:
        """SIGKILL the init (every process of the session dies with it), wait until its uid
        owns no process, and give the uid back. Safe to call twice."""
        self._closed = True
        running, self._running = self._running, None
        if running is not None:
            self._finalizer.detach()  # type: ignore[union-attr]
            await asyncio.to_thread(_end, running)
            await self.sandbox._release(running.uid, running.init_pid)

    async def alisten(self, port: int) -> socket.socket:
        """A TCP socket listening on ``127.0.0.1:port`` in the session's network namespace,
        held by the caller (see :meth:`Session.alisten`); starts the session if needed.

        Raises:
            SandboxError: The session is closed, or the socket cannot be made there.
        """
        async with self._serialized():
            running = await self._started()
        try:
            return netns.listen_in(f"/proc/{running.init_pid}/ns/net", port)
        except OSError as e:
            raise SandboxError(f"cannot listen on port {port} in the session: {e}") from e

    async def __aenter__(self) -> LocalSession:
        async with self._serialized():
            await self._started()
        return self

    # -- one call -------------------------------------------------------------------------

    async def _call(
        self, argv: list[str], stdin: bytes, env: Mapping[str, str], limits: Limits, cap: int
    ) -> tuple[bytes, bytes, int | None, str | None, float]:
        """Run ``argv`` through the init: (stdout, stderr, exit code, killed for, seconds)."""
        async with self._serialized():
            running = await self._started()
            started = time.perf_counter()
            self._calls += 1
            call = self._calls
            env = {**ENV, "PWD": WORKDIR, **env}
            try:
                pipes = send_run(running.control, call, argv, env, limits, bool(stdin))
            except ValueError as e:  # as a program that cannot start: status 126
                said = f"envhub session: cannot run {argv[0] if argv else ''!r}: {e}\n"
                return b"", said.encode(), 126, None, time.perf_counter() - started
            io = CallPipes(*pipes, cap)
            try:
                io.start(stdin)
                code, killed_for = await self._await_exit(running, call, io, limits.wall_time)
                io.drain()
            finally:
                io.close()
            code = None if killed_for else code
            if io.over.done():  # it also exited by itself, but its output was cut
                killed_for = "output_limit"
            seconds = time.perf_counter() - started
            return bytes(io.stdout), bytes(io.stderr), code, killed_for, seconds

    async def _await_exit(
        self, running: _Running, call: int, io: CallPipes, wall_time: float
    ) -> tuple[int, str | None]:
        """The call's exit status, and why it was killed (``timeout``, ``output_limit``)."""
        watch = ExitWatch(running.control, call)
        timer = watch.loop.call_later(wall_time, watch.settle, "timeout")
        io.over.add_done_callback(lambda _: watch.settle("output_limit"))
        try:
            first = await watch.first
            if isinstance(first, int):
                return first, None
            running.control.send(kill_message(call))
            try:
                status = await asyncio.wait_for(watch.exited, KILL_WAIT)
            except asyncio.TimeoutError:
                raise SandboxError("a session's init did not end a killed call") from None
            return int(status), first
        except asyncio.CancelledError:  # the caller gave up on it: end the call, not the session
            if not await end_call(running.control, call, watch):
                await self._abandon()
            raise
        except BaseException:
            await self._abandon()  # the init failed: its replies are out of step
            raise
        finally:
            timer.cancel()
            watch.close()

    async def _abandon(self) -> None:
        """End the session after a failure of its own (it cannot be used any more)."""
        await self.aclose()

    # -- starting -------------------------------------------------------------------------

    async def _started(self) -> _Running:
        """The running session, started now if it was not yet."""
        if self._closed:
            raise SandboxError("the session is closed")
        if self._running is None:
            uid = await self.sandbox._acquire()
            try:
                self._running = await self._start(uid)
            except BaseException:
                await self.sandbox._release(uid, None)
                raise
            self._finalizer = weakref.finalize(
                self, _end_and_release, self._running, self.sandbox.uids
            )
        return self._running

    async def _start(self, uid: int) -> _Running:
        """Mount the session's files and start its sandbox as ``uid`` through the launcher
        (:mod:`envhub.sandbox.session_launcher`); wait for its init: started in the sandbox,
        or (as the sandbox's zygotes do) forked into it from a zygote."""
        compiled = await _compiled_init()
        # The compiled init starts as pid 1 in about the time a zygote takes to fork one in:
        # zygotes serve the Python init only (whose interpreter would take ~10 ms to start)
        joined = self.sandbox.zygote and compiled is None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        info_read, info_write = os.pipe()
        errors_read, errors_write = os.pipe()
        status_read, status_write = os.pipe() if joined else (-1, -1)
        if joined:  # bubblewrap gets the init's status pipe; the zygote gets the socket
            os.fchown(status_read, uid, uid)  # the init reopens it through /proc as `uid`
            init = ["/bin/sh", "-c", zygotes.init_script(FDS["control"]), "sh"]
        else:
            python = [self.sandbox.python, "-S", "-I", "-c", INIT]
            init = [*([COMPILED_PATH] if compiled else python), str(FDS["control"])]
        sent = [errors_write, status_read if joined else theirs.fileno(), info_write]
        try:
            pid, pidfd = self._launch(uid, init, sent, compiled)
        except BaseException:
            for fd in (info_read, errors_read, status_write):
                if fd >= 0:
                    os.close(fd)
            ours.close()
            theirs.close()
            raise
        finally:
            for fd in (info_write, errors_write, status_read):
                if fd >= 0:
                    os.close(fd)
        ours.setblocking(False)
        running = _Running(pid, pidfd, errors_read, uid, ours)
        try:
            if joined:
                await self._join(running, info_read, status_write, theirs)
            await _await_ready(running)
            running.init_pid = running.init_pid or _process.sandbox_init(info_read)
            if joined:
                zygote = _zygote(self.sandbox.python).proc.pid
                running.server_pid = _joined_init(zygote, running.init_pid)
        except BaseException:
            await asyncio.to_thread(_end, running)
            raise
        finally:
            theirs.close()
            os.close(info_read)
        return running

    def _launch(
        self, uid: int, init: list[str], fds: list[int], compiled: Path | None
    ) -> tuple[int, int]:
        """Have the launcher mount the session's files and start bubblewrap around ``init``
        with ``fds`` as its stderr, descriptor 3 and info pipe, and ``compiled`` (the compiled
        init) bound in; its pid and a pidfd."""
        scratch = scratch_flags(str(MOUNT_POINT), self.paths)
        if compiled is not None:
            scratch += ["--ro-bind", str(compiled), COMPILED_PATH]
        argv = bwrap_argv(
            self.sandbox.jail, uid, self.limits, [], FDS["info"], init, False, scratch
        )
        argv[0] = shutil.which(argv[0]) or argv[0]
        workspace = self.workspace.path if self.workspace else None
        try:
            owner = workspace.stat().st_uid if workspace else 0
        except OSError as e:
            raise SandboxError(f"a local session could not start: its workspace: {e}") from e
        mode = self.start if workspace else "empty"
        size = self.limits.disk_mb << 20
        shown = len(self.paths.folders)
        return launcher().launch(str(workspace), owner, uid, size, mode, argv, fds, shown)

    async def _join(
        self, running: _Running, info_read: int, status_write: int, control: socket.socket
    ) -> None:
        """Have the session zygote fork the init into the started sandbox (once bubblewrap
        reports its init's pid) with ``control`` as its socket; closes ``status_write``."""
        try:
            init = await _process.await_sandbox_init(info_read, _START_WAIT)
            if init is None:
                return  # bubblewrap failed: the wait for `ready` reports what it said
            running.init_pid = init
            zygote = _zygote(self.sandbox.python)
            owner = keeper_uid(self.sandbox.uids.base)
            zygote.start(init, running.bwrap, running.uid, status_write, control.fileno(), owner)
        finally:
            os.close(status_write)

    def _serialized(self) -> asyncio.Lock:
        """The lock that keeps the session's calls one at a time (one per event loop)."""
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock[0] is not loop:
            self._lock = (loop, asyncio.Lock())
        return self._lock[1]


async def _compiled_init() -> Path | None:
    """:func:`~envhub.sandbox.session_init_c.compiled_init`, off the event loop when it may
    have to build it (once per machine: the compiler runs for about a second)."""
    if compiled_init.cache_info().currsize:
        return compiled_init()
    return await asyncio.to_thread(compiled_init)


def _joined_init(zygote: int, sandbox_init: int | None) -> int | None:
    """The host pid of the init that the zygote ``zygote`` forked into the sandbox whose pid 1
    is ``sandbox_init`` (a child of one of its joiners, in that pid namespace)."""
    try:
        space = os.readlink(f"/proc/{sandbox_init}/ns/pid")
    except OSError:
        return None
    for joiner in _process._children(zygote):
        for pid in _process._children(joiner):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/ns/pid") == space:
                    return pid
    return None


_ZYGOTES: dict[tuple[int, str], zygotes.Zygote] = {}


def _zygote(python: str) -> zygotes.Zygote:
    """This process's zygote of session inits for ``python``, started when there is none."""
    key = (os.getpid(), python)
    zygote = _ZYGOTES.get(key)
    if zygote is None or not zygote.alive:
        env = {**ENV, "PWD": WORKDIR}
        zygote = zygotes.Zygote(
            shutil.which(python, path=ENV["PATH"]) or python,
            ["-S", "-I"],
            {**env, INIT_VARIABLE: JOINED_INIT},
            WORKDIR,
            source=INIT_LOADER,
            name=INIT_NAME,
        )
        _ZYGOTES[key] = zygote
    return zygote


async def _await_ready(running: _Running) -> None:
    """Wait for the init's ``ready``; on failure, an error with what the start printed."""
    try:
        reply = await asyncio.wait_for(receive(running.control), _START_WAIT)
        if parse_reply(reply)[0] == "ready":
            return
    except (SandboxError, asyncio.TimeoutError, ValueError):
        pass
    await asyncio.to_thread(_end, running, False)  # bubblewrap's stderr is whole once it ended
    os.set_blocking(running.errors, False)
    try:
        said = os.read(running.errors, 1 << 16).decode(errors="replace").strip()
    except OSError:
        said = ""
    raise SandboxError(f"a local session could not start: {said[-500:] or 'no reason given'}")


def _end(running: _Running, close: bool = True) -> None:
    """Kill a session's sandbox (its init first: the kernel then kills its pid namespace) and
    wait for bubblewrap to exit; then (``close``) close what this process holds of it."""
    for pid in _process._children(running.bwrap):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    if not select.select([running.pidfd], [], [], KILL_WAIT)[0]:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(running.pidfd, 9)
        select.select([running.pidfd], [], [], KILL_WAIT)
    if close:
        running.control.close()
        for fd in (running.pidfd, running.errors):
            with contextlib.suppress(OSError):
                os.close(fd)


def _end_and_release(running: _Running, uids: UidPool) -> None:
    """End a session dropped without :meth:`~LocalSession.aclose` and give its uid back once
    it owns no process (else the uid stays out of the pool)."""
    _end(running)
    deadline = time.monotonic() + 2
    while _process.uid_processes(running.uid) and time.monotonic() < deadline:
        time.sleep(0.005)
    if not _process.uid_processes(running.uid):
        uids.release(running.uid)
