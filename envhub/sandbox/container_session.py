"""The container back end's session: one container per episode, commands run in it by the
engine's ``exec``.

A :class:`ContainerSession` starts its container on first use: the image's own file system
(what its Dockerfile built), PID 1 an init that reaps orphans and that nothing in the
container can kill (a ``kill -9 -1`` leaves the session usable), no network unless
``Limits.network``, ``/tmp`` a tmpfs of ``disk_mb``, the session's processes capped by the
engine's pids limit (``processes`` plus the session's own few), its memory by ``memory_mb``
for the whole container. The working folder is ``/sandbox``, or, when the caller asks for it
elsewhere (:class:`~envhub.sandbox.session.SessionPaths` ``workdir``: a Harbor task's
``/app``), that folder as the image has it, with ``/sandbox`` pointing there. A workspace is
mounted copy-on-write over the working folder (Podman's overlay volumes; copied in with
Docker).

Each call runs in its own process group, under the call's rlimits (``prlimit``, when the
image has it), with ``wall_time`` and ``output_bytes`` enforced on the host; a call that
overruns is killed with its group inside the container. :meth:`ContainerSession.aclose`
removes the container with everything in it; so does the back end's reaper when the process
that started it dies, however it dies (:mod:`envhub.sandbox.container_reaper`).

Differences from a local session: commands run as the image's user (root by default, as in
the task's own container); ``disk_mb`` bounds ``/tmp`` only (the image's file system takes
what the engine's storage gives it).
"""

from __future__ import annotations

import asyncio
import posixpath
import shlex
import socket
import uuid
from collections.abc import Mapping
from typing import Protocol

from envhub.errors import SandboxError
from envhub.sandbox import _process, netns
from envhub.sandbox.base import (
    WORKDIR,
    Command,
    ExecResult,
    Limits,
    as_argv,
    as_bytes,
    classify_exit,
    prlimit_argv,
)
from envhub.sandbox.container_engine import OWNER_LABEL, ContainerEngine, env_flags
from envhub.sandbox.session import Session, SessionPaths, Workspace

OWN_PROCESSES = 8
"""Processes of the session's own beside the calls' (its init, the engine's exec helpers)."""
EXEC_SLACK = 0.5
"""Seconds the host waits past ``wall_time`` before it kills a call (the engine's exec
takes ~0.1-0.2 s to start the command)."""
READY = "/run/envhub-ready"
"""Made once the container's folders are laid out (calls wait for it: ``run -d`` returns as
the entrypoint starts)."""
PIDS = "/run/envhub-calls"
"""Where each call's process group id is written, inside the container (a few bytes a call,
left there: removing them would cost each call a second ``exec``)."""

# Each call: its own session and group (setsid, where the image has it); the group id noted in
# a file named for the call; the rlimits set where the image has prlimit.
_LAUNCH = (
    'f=$1; shift; echo $$ > "$f"; '
    'if ! command -v prlimit >/dev/null 2>&1; then while [ "$1" != -- ]; do shift; done; shift; '
    'fi; exec "$@"'
)
_CALL = (
    f"while [ ! -e {READY} ]; do sleep 0.01; done; "
    f"mkdir -p {PIDS}; if command -v setsid >/dev/null 2>&1; then "
    f'exec setsid -w /bin/sh -c {shlex.quote(_LAUNCH)} sh "$@"; fi; '
    f'exec /bin/sh -c {shlex.quote(_LAUNCH)} sh "$@"'
)
_KILL_GROUP = 'g=$(cat "$1" 2>/dev/null) && kill -9 "-$g" 2>/dev/null; rm -f "$1"; true'
_KILL_ALL = (
    'for d in /proc/[0-9]*; do p=${d#/proc/}; [ "$p" = 1 ] || [ "$p" = $$ ] || '
    'kill -9 "$p" 2>/dev/null; done; true'
)


class ContainerHost(Protocol):
    """What a :class:`ContainerSession` uses of the sandbox that starts it: a
    :class:`~envhub.sandbox.container.ContainerSandbox` (whose module imports this one, never
    the reverse)."""

    engine: ContainerEngine
    image: str
    owner: str
    volumes: dict[str, str]

    def init_args(self) -> list[str]:
        """``run`` flags for the session's PID 1."""
        ...

    def init_exec(self) -> str:
        """The shell command that becomes the session's PID 1."""
        ...

    def claim(self) -> None:
        """Get ready for this process's first container."""
        ...


class ContainerSession(Session):
    """One episode's container (see the module docstring). Made by
    :meth:`ContainerSandbox.session <envhub.sandbox.container.ContainerSandbox.session>`.

    Args:
        sandbox: The back end (engine, owner label, the image).
        workspace: Mounted copy-on-write over the working folder (none when ``None``).
        limits: The limits of every call (``processes``, ``memory_mb``, ``disk_mb`` and
            ``network`` hold for the whole container).
        paths: Folders the session shows besides ``/sandbox``.
    """

    def __init__(
        self,
        sandbox: ContainerHost,
        workspace: Workspace | None,
        limits: Limits,
        paths: SessionPaths | None = None,
    ) -> None:
        self.sandbox, self.workspace, self.limits = sandbox, workspace, limits
        self.paths = paths or SessionPaths()
        self.name = f"envhub-{uuid.uuid4().hex[:16]}"
        """The container's name."""
        self.workdir = self.paths.workdir[0] if self.paths.workdir else WORKDIR
        """Where the working folder really is in the container (``/sandbox`` points there)."""
        self._start: asyncio.Task[None] | None = None
        self._closed = False

    async def arun(
        self,
        command: Command,
        *,
        stdin: str | bytes | None = None,
        wall_time: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        """Run ``command`` in the container's working folder (see :meth:`Session.arun`)."""
        limits = self.call_limits(wall_time)
        return await self._call(as_argv(command), as_bytes(stdin or b""), env or {}, limits)

    async def _run_helper(self, argv: list[str], stdin: bytes | None, cap: int) -> ExecResult:
        limits = self.limits.with_(wall_time=max(self.limits.wall_time, 30.0), output_bytes=cap)
        return await self._call(argv, stdin or b"", {}, limits, raw=True)

    async def alisten(self, port: int) -> socket.socket:
        """A TCP socket listening on ``127.0.0.1:port`` in the container's network namespace,
        held by the caller (see :meth:`Session.alisten`): a program in the container reaches
        what the caller serves there, and nothing else when the session has no network.
        Needs root (to enter the namespace); starts the session if needed.

        Raises:
            SandboxError: The session is closed, or the socket cannot be made there.
        """
        await self._started()
        try:
            pid = int(await asyncio.to_thread(self._init_pid))
            return netns.listen_in(f"/proc/{pid}/ns/net", port)
        except (OSError, ValueError, SandboxError) as e:
            raise SandboxError(f"cannot listen on port {port} in {self.name}: {e}") from e

    def _init_pid(self) -> str:
        """The host pid of the container's init (its namespaces are the session's)."""
        return self.sandbox.engine.call("inspect", "--format", "{{.State.Pid}}", self.name).strip()

    async def akill_processes(self) -> None:
        """SIGKILL every process of the container but its init (the session stays usable)."""
        await self._exec_plain(["/bin/sh", "-c", _KILL_ALL])

    async def _call(
        self,
        argv: list[str],
        stdin: bytes,
        env: Mapping[str, str],
        limits: Limits,
        raw: bool = False,
    ) -> ExecResult:
        """One call under ``limits``; ``raw``: stdout decoded with ``surrogateescape``."""
        await self._started()
        engine = self.sandbox.engine
        marker = f"{PIDS}/{uuid.uuid4().hex}"
        rlimits = prlimit_argv(limits, limits.processes + OWN_PROCESSES)
        command = engine.command(
            "exec", "-i", "-w", WORKDIR, *env_flags(env), self.name,
            "/bin/sh", "-c", _CALL, "sh", marker, *rlimits, *argv,
        )  # fmt: skip
        outcome = await _process.execute(
            command,
            stdin=stdin,
            output_cap=limits.output_bytes,
            deadline=limits.wall_time + EXEC_SLACK,
        )
        if outcome.killed_for:  # the engine's exec client is gone; the command is not
            await self._exec_plain(["/bin/sh", "-c", _KILL_GROUP, "sh", marker])
        stderr = outcome.stderr.decode("utf-8", "replace")
        if outcome.exit_code in (125, 126, 127) and self._gone(stderr):
            raise SandboxError(f"the session's container {self.name} is gone: {stderr[-300:]}")
        stdout = outcome.stdout.decode("utf-8", "surrogateescape" if raw else "replace")
        code = outcome.exit_code
        reason = outcome.killed_for or classify_exit(code if code is not None else 0, stderr)
        return ExecResult(stdout, stderr, code, reason, outcome.seconds)  # type: ignore[arg-type]

    def _gone(self, stderr: str) -> bool:
        """Whether the engine's error says the container no longer runs."""
        return any(
            words in stderr
            for words in ("no such container", "is not running", "No such container")
        )

    async def _exec_plain(self, argv: list[str]) -> None:
        """A command of the session's own, unlimited, its result ignored."""
        command = self.sandbox.engine.command("exec", self.name, *argv)
        await _process.execute(command, stdin=b"", output_cap=1 << 16, deadline=60.0)

    async def _started(self) -> None:
        """The container, started on first use (once, however many calls wait for it)."""
        if self._closed:
            raise SandboxError("the session is closed")
        if self._start is None:
            self._start = asyncio.ensure_future(asyncio.to_thread(self._create))
        await asyncio.shield(self._start)

    def _create(self) -> None:
        """Start the container (it lays out its folders, then becomes its init)."""
        engine = self.sandbox.engine
        self.sandbox.claim()
        engine.call(*self._run_args(), timeout=300)
        try:
            if self.workspace is not None and not self._mounts_workspace:
                engine.call("cp", f"{self.workspace.path}/.", f"{self.name}:{self.workdir}")
        except BaseException:
            engine.remove([self.name])
            raise

    @property
    def _mounts_workspace(self) -> bool:
        """Whether the workspace is an overlay mount (Podman) rather than copied in."""
        return self.workspace is not None and self.sandbox.engine.name == "podman"

    def _run_args(self) -> list[str]:
        """``run`` for the session's container, detached: a shell that lays out the folders
        (one engine call fewer than an ``exec`` after it), then execs the init."""
        limits, engine = self.limits, self.sandbox.engine
        disk = f"size={limits.disk_mb}m,mode=1777"
        args = [
            "run", "-d", "--name", self.name,
            f"--label={OWNER_LABEL}={self.sandbox.owner}",
            f"--network={'bridge' if limits.network else 'none'}",
            f"--memory={limits.memory_mb}m",
            f"--pids-limit={limits.processes + OWN_PROCESSES}",
            f"--tmpfs=/tmp:{disk}",
            *engine.run_flags(limits.open_files),
        ]  # fmt: skip
        if self._mounts_workspace:
            assert self.workspace is not None
            args.append(f"--volume={self.workspace.path}:{self.workdir}:O")
        args += [f"--volume={host}:{inside}:ro" for host, inside in self.sandbox.volumes.items()]
        start = f"{self._layout_script()} && touch {READY} && {self.sandbox.init_exec()}"
        image = self.sandbox.image
        return [*args, *self.sandbox.init_args(), "--entrypoint=/bin/sh", image, "-c", start]

    def _layout_script(self) -> str:
        """Shell that makes the working folder, ``/sandbox`` pointing at it, and the
        session's empty folders."""
        steps = [f"mkdir -p {shlex.quote(self.workdir)}"]
        links = [WORKDIR, *self.paths.workdir[1:]] if self.workdir != WORKDIR else []
        target = shlex.quote(self.workdir)
        for link in map(shlex.quote, links):
            steps.append(f"rm -rf {link} && ln -s {target} {link}")
        for folder in self.paths.folders:
            steps.append(f"rm -rf {shlex.quote(folder)} && mkdir -p {shlex.quote(folder)}")
            steps.append(f"chmod 777 {shlex.quote(folder)}")
        steps.append(f"mkdir -p {posixpath.dirname(PIDS)}")
        return " && ".join(steps)

    async def aclose(self) -> None:
        """Remove the container with everything in it. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        start, self._start = self._start, None
        if start is not None:
            try:
                await start
            except BaseException:
                return  # it never started, or removed itself when it failed
            await asyncio.to_thread(self.sandbox.engine.remove, [self.name])
