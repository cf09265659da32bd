"""The local backend's policy: :class:`LocalSandbox`, which decides how each run starts.

What a run can see and do is built elsewhere, to be reviewed on its own:
:mod:`envhub.sandbox.jail` (bubblewrap's command line, the uid drop, the rlimits) or, with the
weaker ``isolation="rlimits"`` fallback that is never chosen automatically,
:mod:`envhub.sandbox.fallback`. What that contains and what it does not:
:mod:`envhub.sandbox.threat_model`. This module decides, for each call:

- **Which uid.** Each concurrent run gets its own uid from a pool (:mod:`envhub.sandbox.uids`,
  ``base_uid`` upwards), so the process limit of one run is not shared with another and no
  process of a finished run can survive unnoticed: a run's uid is only handed out again once it
  owns no process. That is known without reading ``/proc`` when the sandbox's init (its pid 1,
  whose host pid bubblewrap reports) is gone: the kernel kills and reaps every process of a pid
  namespace before its init's exit completes. Otherwise (a run bubblewrap could not start, the
  rlimits fallback) the host's ``/proc`` is searched for the uid. When envhub is not root, runs
  use the caller's own uid (the process limit then counts the caller's processes too).
- **How it starts.** A Python run (``python [FLAGS] SCRIPT``, no output files) can take a
  sandbox started ahead, its interpreter waiting in a stub (:mod:`envhub.sandbox.warm`): the
  same sandbox, started before the call instead of during it. As root, its interpreter is
  instead forked from a zygote that started once (:mod:`envhub.sandbox.zygote`) into the
  sandbox's namespaces, which saves the ~10 ms of CPU an interpreter start costs on every run.
  Any other run starts cold: bubblewrap, the sandbox's init, the command.
- **When to start sandboxes ahead**, and which waiting one to stop for a call that finds no
  free uid.

A forked child leaves its parent's warm sandboxes, zygotes and uids alone: in the child, each
:class:`LocalSandbox` forgets them and claims uids of its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import tempfile
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from envhub.errors import ConfigError, SandboxError, SandboxUnavailableError
from envhub.sandbox import _process
from envhub.sandbox import zygote as zygotes
from envhub.sandbox.base import (
    WORKDIR,
    Command,
    ExecResult,
    Files,
    Limits,
    Sandbox,
    as_argv,
    as_bytes,
    check_relative,
    classify_exit,
)
from envhub.sandbox.fallback import fallback_argv, read_back, write_inputs
from envhub.sandbox.jail import (
    ENV,
    Isolation,
    Jail,
    bwrap_argv,
    bwrap_problem,
    input_files,
    nproc,
    shell_is_dash,
    shown_path_problem,
    ulimit_prologue,
)
from envhub.sandbox.local_session import LocalSession, Start
from envhub.sandbox.outputs import ALL_FILES, init_script, parse_outputs
from envhub.sandbox.session import SessionPaths, Workspace, as_workspace
from envhub.sandbox.uids import forget_pools, uid_pool
from envhub.sandbox.warm import (
    Kind,
    WarmSandbox,
    WarmSet,
    close_fds,
    job_for,
    kind_of,
    script_of,
    stop,
    stop_all,
    stub_argv,
)

_HINT = (
    "install bubblewrap (`apt-get install bubblewrap`) on a kernel with unprivileged user "
    "namespaces (sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces > 0), use "
    "the e2b backend, or accept the weaker `LocalSandbox(isolation='rlimits')` (no file or "
    "network isolation) explicitly"
)


class LocalSandbox(Sandbox):
    """Runs commands on this machine, each in a fresh bubblewrap sandbox with rlimits.

    Args:
        limits: Default limits of every run.
        max_concurrency: Runs at once (each has its own uid); more calls wait for a free slot.
        base_uid: Where the pool's uids start (used only when envhub runs as root): the pool
            takes the first ``max_concurrency`` uids from here that no other envhub process on
            the machine holds. Pick a range no user or service of the machine uses.
        isolation: ``"bwrap"`` (the default), or ``"rlimits"``: the weaker fallback without
            namespaces, for machines that cannot run bubblewrap (:mod:`envhub.sandbox.fallback`).
        bwrap: The bubblewrap executable.
        ro_binds: Extra host paths mounted read-only at the same place (an interpreter that
            lives outside ``/usr``, a dataset).
        python: The Python inside the sandbox (default: the system's ``python3`` in ``/usr``).
        warm: Sandboxes kept started ahead for each kind of Python run seen so far (see
            :mod:`envhub.sandbox.warm`): a call of ``python [FLAGS] SCRIPT`` with no output
            files then starts in ~1 ms instead of ~16. Each holds a uid of the pool while it
            waits; a call that finds no free uid stops one. ``0`` turns this off.
        zygote: As root, fork Python runs from an interpreter started once per set of flags
            (:mod:`envhub.sandbox.zygote`) instead of starting one per run: ~9 ms less CPU a
            run, so more runs/s when runs queue for the cores; sessions' Python init too (the
            compiled one, where ``cc`` builds it, starts as fast without). Elsewhere it has no
            effect.

    Raises:
        SandboxUnavailableError: bubblewrap is missing or user namespaces are disabled.
    """

    backend = "local"
    _instances: ClassVar[weakref.WeakSet[LocalSandbox]] = weakref.WeakSet()
    """Every live local sandbox of this process (each resets itself in a forked child)."""

    def __init__(
        self,
        limits: Limits | None = None,
        *,
        max_concurrency: int | None = None,
        base_uid: int = 61000,
        isolation: Isolation = "bwrap",
        bwrap: str = "bwrap",
        ro_binds: Sequence[str] = (),
        python: str = "python3",
        warm: int = 2,
        zygote: bool = True,
    ) -> None:
        super().__init__(limits, python=python)
        if isolation not in ("bwrap", "rlimits"):
            raise ConfigError(f"isolation must be 'bwrap' or 'rlimits', got {isolation!r}")
        if isolation == "bwrap":
            problem = bwrap_problem(bwrap)
            if problem:
                raise SandboxUnavailableError(f"the local sandbox cannot run: {problem}; {_HINT}")
            bwrap = shutil.which(bwrap) or bwrap
        for tool in ("prlimit", "setpriv"):
            if shutil.which(tool) is None:
                raise SandboxUnavailableError(
                    f"the local sandbox needs `{tool}` (util-linux); install util-linux"
                )
        self.max_concurrency = max_concurrency or max(4, 4 * (os.cpu_count() or 1))
        as_root = os.geteuid() == 0
        self.jail = Jail(
            isolation,
            as_root,
            bwrap,
            tuple(ro_binds),
            limits_in_init=isolation == "bwrap" and shell_is_dash(),
            keeps_netns=isolation == "bwrap" and as_root and bool(shutil.which("nsenter")),
        )
        """How every run is confined (:mod:`envhub.sandbox.jail`)."""
        # Not root: every run is the caller's uid; the pool then only bounds concurrency.
        first, step = (base_uid, 1) if as_root else (os.getuid(), 0)
        self.uids = uid_pool(first, self.max_concurrency, step)
        self.warm = max(0, warm) if isolation == "bwrap" else 0
        self.zygote = zygote and isolation == "bwrap" and as_root
        """Whether Python runs fork from a zygote (as root), not a stub of their own."""
        self._zygotes: dict[tuple[str, ...], zygotes.Zygote] = {}
        self.zygote_runs = 0
        """Calls a zygote forked (:mod:`envhub.sandbox.zygote`)."""
        self._warm = WarmSet(self.uids)
        self.warm_runs = 0
        """Calls that took a warm sandbox."""
        self._in_flight = 0
        weakref.finalize(self, stop_all, self._warm)
        weakref.finalize(self, _stop_zygotes, self._zygotes)
        self._instances.add(self)

    async def arun(
        self,
        command: Command,
        *,
        stdin: str | bytes | None = None,
        files: Files | None = None,
        output_files: Sequence[str] = (),
        limits: Limits | None = None,
    ) -> ExecResult:
        """Run ``command`` in a fresh bubblewrap sandbox, or under rlimits alone.

        Each run first takes a slot of the uid pool, waiting while all ``max_concurrency`` are in
        use. ``output_files`` may be ``[ALL_FILES]`` to get every file of the working folder
        back. See :meth:`Sandbox.arun` for the arguments.
        """
        limits = limits or self.limits
        argv = as_argv(command)
        inputs = {check_relative(path): as_bytes(data) for path, data in (files or {}).items()}
        wanted = (
            list(output_files)
            if list(output_files) == [ALL_FILES]
            else [check_relative(p) for p in output_files]
        )
        pythonic = (self.warm or self.zygote) and not wanted
        script = script_of(argv, self.python, inputs) if pythonic else None
        # A warm run costs ~2 ms more CPU than a cold one (the stub's work; measured), and its
        # refill runs beside it: worth it while a core stays idle, not once runs queue for them
        # (on 2 cores: 2 at once ran 17 ms warm against 15 cold). A zygote run costs ~9 ms less
        # than a cold one: always worth it.
        with self._warm.lock:
            idle_cores = self._in_flight + 1 < max(2, os.cpu_count() or 1)
            self._in_flight += 1
        try:
            worth = idle_cores or self.zygote
            kind = kind_of(argv, script, limits) if script is not None and worth else None
            if kind is not None and (box := self._take_warm(kind)) is not None:
                self.warm_runs += 1
                self._refill(kind)  # the next one starts while this one runs
                return await self._run_warm(box, argv, script, stdin, inputs, limits)  # type: ignore[arg-type]
            uid = await self._acquire()
            if kind is not None:
                self._refill(kind)  # the first of its kind, or none was ready: warm the next
            if kind is not None and self._uses_zygote(kind):  # none was ready: start one now
                box = self._start_now(kind, uid)
                return await self._run_warm(box, argv, script, stdin, inputs, limits)  # type: ignore[arg-type]
            outcome = None
            try:
                if self.isolation == "bwrap":
                    outcome = await self._run_bwrap(uid, argv, stdin, inputs, wanted, limits)
                else:
                    outcome = await self._run_rlimits(uid, argv, stdin, inputs, wanted, limits)
            finally:
                await self._release(uid, outcome.sandbox_init if outcome else None)
            return _result(outcome, wanted, limits)
        finally:
            with self._warm.lock:
                self._in_flight -= 1

    def session(
        self,
        workspace: Workspace | str | os.PathLike[str] | None = None,
        *,
        limits: Limits | None = None,
        start: Start = "overlay",
        paths: SessionPaths | None = None,
    ) -> LocalSession:
        """A sandbox for one episode, started on first use, its working folder a
        copy-on-write view of ``workspace`` (``start="copy"``: a copy of it), showing the
        folders of ``paths`` too (:mod:`envhub.sandbox.local_session`). It holds a uid of the
        pool until it is closed.

        Raises:
            SandboxUnavailableError: Not root, or the ``rlimits`` fallback.
            ConfigError: A path of ``paths`` it cannot show (:meth:`session_path_problem`).
        """
        workspace = as_workspace(workspace)
        return LocalSession(self, workspace, limits or self.limits, start, paths)

    def session_path_problem(self, path: str) -> str | None:
        """Why a local session cannot show a folder at ``path``, or ``None``: any path but
        those the sandbox's root already has (:func:`~envhub.sandbox.jail.shown_path_problem`)."""
        return shown_path_problem(self.jail, path)

    @property
    def isolation(self) -> Isolation:
        """``"bwrap"``, or the ``"rlimits"`` fallback (:mod:`envhub.sandbox.fallback`)."""
        return self.jail.isolation

    @property
    def as_root(self) -> bool:
        """Whether envhub runs as root: each run then has a uid of its own."""
        return self.jail.as_root

    @property
    def keeps_netns(self) -> bool:
        """Whether runs start in their uid's kept network namespace (:mod:`.netns`), not one
        bubblewrap makes per run."""
        return self.jail.keeps_netns

    @property
    def limits_in_init(self) -> bool:
        """Whether the sandbox's init sets the rlimits (dash's ``ulimit``), not ``prlimit``
        (settable: ``False`` has ``prlimit`` set them on any shell)."""
        return self.jail.limits_in_init

    @limits_in_init.setter
    def limits_in_init(self, value: bool) -> None:
        self.jail = dataclasses.replace(self.jail, limits_in_init=value)

    @property
    def warm_uids(self) -> frozenset[int]:
        """The uids held by warm sandboxes waiting for a call (their processes run no code
        of any call yet)."""
        return self._warm.held_uids()

    async def aclose(self) -> None:
        """Stop the warm sandboxes (their uids go back to the pool). Calls after this start
        new ones as needed."""
        await asyncio.gather(*[self._discard(box) for box in self._warm.take_all()])
        await asyncio.to_thread(_stop_zygotes, self._zygotes)

    async def _acquire(self) -> int:
        """A uid for a run: a free one, else one a warm sandbox held (stopped for it), else
        the next one freed."""
        uid = self.uids.try_acquire()
        if uid is None and (evicted := self._warm.take()) is not None:
            await self._discard(evicted)
            uid = self.uids.try_acquire()
        return uid if uid is not None else await self.uids.acquire()

    def _take_warm(self, kind: Kind) -> WarmSandbox | None:
        """A warm sandbox of ``kind`` whose stub is still alive, or ``None``."""
        while (box := self._warm.take(kind)) is not None:
            if box.proc.poll() is None:
                return box
            stop(box, self.uids)  # it died waiting (killed from outside)
        return None

    def _refill(self, kind: Kind) -> None:
        """Start warm sandboxes of ``kind`` up to :attr:`warm`, with uids nobody waits for."""
        with self._warm.lock:
            if not self._warm.admit(kind, _WARM_KINDS):
                return
            while self._warm.count(kind) < self.warm and not self.uids.waiting:
                uid = self.uids.try_acquire()
                if uid is None:
                    return
                try:
                    self._warm.put(self._start_warm(kind, uid))
                except SandboxError:
                    self.uids.release(uid)  # it never started: the uid owns nothing
                    return

    def _start_warm(self, kind: Kind, uid: int) -> WarmSandbox:
        """Start a sandbox of ``kind`` as ``uid`` whose stub waits for a job (or, with
        zygotes, whose init waits for a zygote's run: :mod:`envhub.sandbox.zygote`)."""
        limits = self.limits.with_(network=kind[1], disk_mb=kind[2])
        job_read, job_write = os.pipe()
        info_read, info_write = os.pipe()
        if self._uses_zygote(kind):
            self._zygote_for(kind)  # counted among the kinds now; it starts beside bubblewrap
            status_read, status_write = os.pipe()
            os.fchown(status_read, uid, uid)  # the init reopens it through /proc as `uid`
            command = ["/bin/sh", "-c", zygotes.init_script(status_read), "sh"]
            passed, zygote_fds = [status_read, info_write], (status_write, job_read)
        else:
            init = ["/bin/sh", "-c", init_script(), "sh"]
            command = [*init, *stub_argv(self.python, kind, job_read)]
            passed, zygote_fds = [job_read, info_write], None
        full = bwrap_argv(self.jail, uid, limits, [], info_write, command, rlimits=False)
        try:
            proc = _process.spawn(full, pass_fds=passed)
        except SandboxError:
            for fd in (job_write, info_read, *(zygote_fds or ())):
                os.close(fd)
            raise
        return WarmSandbox(kind, uid, proc, job_write, info_read, zygote_fds)

    def _start_now(self, kind: Kind, uid: int) -> WarmSandbox:
        """A sandbox of ``kind`` started for the call at hand (none was ready), as ``uid``."""
        try:
            return self._start_warm(kind, uid)
        except SandboxError:
            self.uids.release(uid)  # it never started: the uid owns nothing
            raise

    def _uses_zygote(self, kind: Kind) -> bool:
        """Whether runs of ``kind`` fork from a zygote: with zygotes on, for the first
        ``_WARM_KINDS`` sets of interpreter flags seen (each one more interpreter kept)."""
        if not self.zygote:
            return False
        with self._warm.lock:
            return kind[0] in self._zygotes or len(self._zygotes) < _WARM_KINDS

    def _zygote_for(self, kind: Kind) -> zygotes.Zygote:
        """The live zygote of ``kind``'s interpreter flags, started when there is none."""
        with self._warm.lock:
            zygote = self._zygotes.get(kind[0])
            if zygote is None or not zygote.alive:
                # PWD too: a cold run's interpreter gets it from the init's shell
                zygote = zygotes.Zygote(self.python, kind[0], {**ENV, "PWD": WORKDIR}, WORKDIR)
                self._zygotes[kind[0]] = zygote
            return zygote

    def _drop_zygote(self, kind: Kind) -> None:
        """Forget (and end) the zygote of ``kind``'s flags: the next run starts another."""
        with self._warm.lock:
            zygote = self._zygotes.pop(kind[0], None)
        if zygote is not None:
            zygote.proc.kill()
            zygote.stop()

    async def _hand_to_zygote(self, box: WarmSandbox) -> int | None:
        """Have a zygote fork ``box``'s run into it; the sandbox init's host pid (``None``:
        bubblewrap failed, and so does the run, with bubblewrap's error)."""
        init = await _process.await_sandbox_init(box.info_fd, 10.0)
        status_fd, job_fd = box.zygote_fds  # type: ignore[misc]
        box.zygote_fds = None

        def send() -> None:
            self._zygote_for(box.kind).start(init, box.proc.pid, box.uid, status_fd, job_fd)

        try:
            if init is not None:
                try:
                    send()
                except SandboxError:  # it died since it was last seen alive: once more, anew
                    self._drop_zygote(box.kind)
                    send()
                self.zygote_runs += 1
        finally:
            os.close(status_fd)  # the joiner holds it now: the init's read ends with its status
            os.close(job_fd)
        return init

    async def _run_warm(
        self,
        box: WarmSandbox,
        argv: list[str],
        script: int,
        stdin: str | bytes | None,
        inputs: dict[str, bytes],
        limits: Limits,
    ) -> ExecResult:
        """Run ``argv`` in a warm sandbox: send its stub the job, then drive it as a run."""
        started = time.perf_counter()
        payload = job_for(argv, script, inputs, limits, limits.processes)
        init = None
        if box.zygote_fds:
            try:
                init = await self._hand_to_zygote(box)
            except BaseException:  # no zygote took it: stop the sandbox, free its uid
                await self._discard(box)
                raise
        outcome = None
        try:
            outcome = await _process.drive(
                box.proc,
                stdin=as_bytes(stdin or b""),
                output_cap=limits.output_bytes,
                deadline=limits.wall_time,
                feeds=[(box.job_fd, payload)],
                started=started,
            )
            outcome.sandbox_init = init or _process.sandbox_init(box.info_fd)
        finally:
            os.close(box.info_fd)
            await self._release(box.uid, outcome.sandbox_init if outcome else None)
        return _result(outcome, [], limits)

    async def _discard(self, box: WarmSandbox) -> None:
        """Stop a warm sandbox that never got a job; its uid goes back to the pool."""
        _process.kill(box.proc, False)
        await asyncio.to_thread(box.proc.wait)
        sandbox_init = _process.sandbox_init(box.info_fd)
        close_fds(box)
        await self._release(box.uid, sandbox_init)

    async def _release(self, uid: int, sandbox_init: int | None) -> None:
        """Return ``uid`` to the pool once it owns no process: at once when the sandbox's init
        has gone (with it every process of its pid namespace), else after searching /proc."""
        try:
            if self.as_root and (sandbox_init is None or os.path.exists(f"/proc/{sandbox_init}")):
                await _process.wait_uid_gone(uid)
        finally:
            self.uids.release(uid)

    async def _run_bwrap(
        self,
        uid: int,
        argv: list[str],
        stdin: str | bytes | None,
        inputs: dict[str, bytes],
        wanted: list[str],
        limits: Limits,
    ) -> _process.Outcome:
        """Run ``argv`` cold as ``uid``: bubblewrap builds the sandbox
        (:func:`~envhub.sandbox.jail.bwrap_argv`), whose init sets the rlimits, runs the
        command and sends the ``wanted`` files back through a pipe."""
        fds, flags = input_files(inputs)
        channel_read, channel = None, None
        if wanted:
            channel_read, channel_write = os.pipe()
            os.fchown(channel_write, uid, uid)  # the sandbox reopens it through /proc as `uid`
            fds.append(channel_write)
            channel = f"/proc/self/fd/{channel_write}"
        # sh is the sandbox's pid 1 (--as-pid-1): bubblewrap's own init would leave a zombie
        # for the host's init to reap, holding a slot of the uid's process limit meanwhile.
        in_init = self.limits_in_init
        prologue = ulimit_prologue(limits, nproc(self.jail, uid, limits)) if in_init else ""
        init = ["/bin/sh", "-c", init_script(wanted, channel, prologue=prologue), "sh"]
        # bubblewrap writes the host pid of the sandbox's init here (closed inside the sandbox).
        info_read, info_write = os.pipe()
        fds.append(info_write)
        full = bwrap_argv(self.jail, uid, limits, flags, info_write, [*init, *argv])
        try:
            outcome = await _process.execute(
                full,
                stdin=as_bytes(stdin or b""),
                output_cap=limits.output_bytes,
                deadline=limits.wall_time,
                pass_fds=fds,
                channel_fd=channel_read,
                channel_cap=(limits.disk_mb << 20) + (1 << 20),
            )
            outcome.sandbox_init = _process.sandbox_init(info_read)
        finally:
            os.close(info_read)
        return outcome

    async def _run_rlimits(
        self,
        uid: int,
        argv: list[str],
        stdin: str | bytes | None,
        inputs: dict[str, bytes],
        wanted: list[str],
        limits: Limits,
    ) -> _process.Outcome:
        """Run ``argv`` as ``uid`` in the ``rlimits`` fallback (:mod:`envhub.sandbox.fallback`),
        in a temporary folder of its own and a session of its own (a kill ends all of it)."""
        with tempfile.TemporaryDirectory(prefix="envhub-sandbox-") as folder:
            write_inputs(Path(folder), inputs, uid, self.as_root)
            outcome = await _process.execute(
                fallback_argv(self.jail, uid, limits, folder, argv),
                stdin=as_bytes(stdin or b""),
                output_cap=limits.output_bytes,
                deadline=limits.wall_time,
                cwd=folder,
                new_session=True,
            )
            outcome.channel = read_back(Path(folder), wanted)
            return outcome

    @classmethod
    def _after_fork_in_child(cls) -> None:
        """Leave the parent's uids, warm sandboxes and zygotes to the parent: forget its uid
        pools, then have each sandbox reset itself (:meth:`_after_fork`)."""
        forget_pools()
        for box in list(cls._instances):
            box._after_fork()

    def _after_fork(self) -> None:
        """In a forked child: forget the parent's zygotes and calls in flight, then (through
        the warm set) its warm sandboxes, and claim a pool of uids of its own."""
        self._zygotes = {}  # the parent's children, talking to the parent
        self._in_flight = 0  # the parent's calls, which never end here
        self.uids = self._warm.after_fork()


_WARM_KINDS = 4
"""Kinds of Python run kept warm at most (the first ones seen)."""

os.register_at_fork(after_in_child=LocalSandbox._after_fork_in_child)


def _stop_zygotes(running: dict[tuple[str, ...], zygotes.Zygote]) -> None:
    """Stop a sandbox's zygotes (they start again when needed)."""
    for zygote in list(running.values()):
        zygote.stop()
    running.clear()


def _result(outcome: _process.Outcome, wanted: list[str], limits: Limits) -> ExecResult:
    stdout = outcome.stdout.decode("utf-8", errors="replace")
    stderr = outcome.stderr.decode("utf-8", errors="replace")
    if outcome.killed_for:
        reason = outcome.killed_for
    else:
        reason = classify_exit(outcome.exit_code if outcome.exit_code is not None else 0, stderr)
    files = parse_outputs(outcome.channel, wanted) if wanted and not outcome.killed_for else {}
    return ExecResult(stdout, stderr, outcome.exit_code, reason, outcome.seconds, files)  # type: ignore[arg-type]
