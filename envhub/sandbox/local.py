"""The local backend: bubblewrap namespaces plus rlimits, as a non-root uid.

Each run is ``setpriv --reuid U --regid U --clear-groups -- bwrap <flags> -- /bin/sh -c <init>
<command>`` (as root, ``nsenter --net=<U's namespace> --setuid U --setgid U`` in place of
``setpriv``: see :mod:`envhub.sandbox.netns`): the process drops to an unprivileged uid of its
own (RLIMIT_NPROC does not bind uid 0, so a fork bomb is only contained this way), bubblewrap
builds an empty world, and the sandbox's init sets the rlimits with its ``ulimit`` builtin
before it starts the command. That is where ``/bin/sh`` is dash (Debian, Ubuntu); with another
shell ``prlimit <limits> --`` goes in front instead, one more exec per run. The world
bubblewrap builds: new user, pid, network, ipc, uts and cgroup namespaces, the system's
``/usr`` read-only, a private size-limited tmpfs as the working folder (``/sandbox``, ``/tmp``
points into it), no environment variables, no nested user namespaces, and every process killed
when the run ends or the caller dies (``--die-with-parent``).

Each concurrent run gets its own uid from a pool (``base_uid`` upwards), so the process limit of
one run is not shared with another and no process of a finished run can survive unnoticed: a
run's uid is only handed out again once it owns no process. That is known without reading
``/proc`` when the sandbox's init (its pid 1, whose host pid bubblewrap reports) is gone: the
kernel kills and reaps every process of a pid namespace before its init's exit completes.
Otherwise (a run bubblewrap could not start, the rlimits fallback) the host's ``/proc`` is
searched for the uid. When envhub is not root, runs use the caller's own uid (the process limit
then counts the caller's processes too).

A Python run (``python [FLAGS] SCRIPT``, no output files) can take a sandbox started ahead,
its interpreter waiting in a stub (:mod:`envhub.sandbox.warm`): the same sandbox, started
before the call instead of during it. As root, its interpreter is instead forked from a zygote
that started once (:mod:`envhub.sandbox.zygote`) into the sandbox's namespaces, which saves
the ~10 ms of CPU an interpreter start costs on every run.

``isolation="rlimits"`` is the documented weaker fallback for machines without user namespaces:
rlimits and the uid drop only (memory, CPU, processes, file size, output and wall time are
limited; host files and the network are NOT protected). It is never chosen automatically.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from envhub.errors import ConfigError, SandboxError, SandboxUnavailableError
from envhub.sandbox import _process, netns
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
    prlimit_argv,
)
from envhub.sandbox.outputs import ALL_FILES, frame, init_script, parse_outputs
from envhub.sandbox.system_files import prepared_etc
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

Isolation = Literal["bwrap", "rlimits"]
_RO_SYSTEM = ("/usr",)
_NET_FILES = (
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/nsswitch.conf",
    "/etc/ssl",
    "/etc/ca-certificates",
)
_LINKS = {"/lib": "usr/lib", "/lib64": "usr/lib64", "/bin": "usr/bin", "/sbin": "usr/sbin"}
ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": WORKDIR,
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
}
_HINT = (
    "install bubblewrap (`apt-get install bubblewrap`) on a kernel with unprivileged user "
    "namespaces (sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces > 0), use "
    "the e2b backend, or accept the weaker `LocalSandbox(isolation='rlimits')` (no file or "
    "network isolation) explicitly"
)


@functools.lru_cache(maxsize=4)
def bwrap_problem(bwrap: str = "bwrap") -> str | None:
    """Why bubblewrap cannot sandbox here, or ``None`` when it can (checked once per process)."""
    path = shutil.which(bwrap)
    if path is None:
        return f"`{bwrap}` is not installed"
    links = [
        x
        for link, target in _LINKS.items()
        if os.path.islink(link)
        for x in ("--symlink", target, link)
    ]
    probe = [
        path,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--ro-bind",
        "/usr",
        "/usr",
        *links,
        "--",
        "/usr/bin/true",
    ]
    try:
        done = subprocess.run(probe, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bubblewrap failed to start: {e}"
    if done.returncode != 0:
        reason = done.stderr.decode(errors="replace").strip()
        return f"bubblewrap cannot create namespaces here: {reason}"
    return None


class LocalSandbox(Sandbox):
    """Runs commands on this machine, each in a fresh bubblewrap sandbox with rlimits.

    Args:
        limits: Default limits of every run.
        max_concurrency: Runs at once (each has its own uid); more calls wait for a free slot.
        base_uid: Where the pool's uids start (used only when envhub runs as root): the pool
            takes the first ``max_concurrency`` uids from here that no other envhub process on
            the machine holds. Pick a range no user or service of the machine uses.
        isolation: ``"bwrap"`` (the default), or ``"rlimits"``: the weaker fallback without
            namespaces, for machines that cannot run bubblewrap (see the module docstring).
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
            run, so more runs/s when runs queue for the cores. Elsewhere it has no effect.

    Raises:
        SandboxUnavailableError: bubblewrap is missing or user namespaces are disabled.
    """

    backend = "local"

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
        self.isolation = isolation
        if isolation == "bwrap":
            problem = bwrap_problem(bwrap)
            if problem:
                raise SandboxUnavailableError(f"the local sandbox cannot run: {problem}; {_HINT}")
            self.bwrap = shutil.which(bwrap) or bwrap
        for tool in ("prlimit", "setpriv"):
            if shutil.which(tool) is None:
                raise SandboxUnavailableError(
                    f"the local sandbox needs `{tool}` (util-linux); install util-linux"
                )
        self.max_concurrency = max_concurrency or max(4, 4 * (os.cpu_count() or 1))
        self.as_root = os.geteuid() == 0
        # Not root: every run is the caller's uid; the pool then only bounds concurrency.
        first, step = (base_uid, 1) if self.as_root else (os.getuid(), 0)
        self.uids = _process.uid_pool(first, self.max_concurrency, step)
        self.ro_binds = tuple(ro_binds)
        self.limits_in_init = isolation == "bwrap" and shell_is_dash()
        """Whether the sandbox's init sets the rlimits (dash's ``ulimit``), not ``prlimit``."""
        self.keeps_netns = isolation == "bwrap" and self.as_root and bool(shutil.which("nsenter"))
        """Whether runs start in their uid's kept network namespace (:mod:`.netns`), not one
        bubblewrap makes per run."""
        self.warm = max(0, warm) if isolation == "bwrap" else 0
        self.zygote = zygote and isolation == "bwrap" and self.as_root
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
        _INSTANCES.add(self)

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

    @property
    def warm_uids(self) -> frozenset[int]:
        """The uids held by warm sandboxes waiting for a call (their processes run no code
        of any call yet)."""
        with self._warm.lock:
            return frozenset(box.uid for boxes in self._warm.boxes.values() for box in boxes)

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
            boxes = self._warm.boxes.get(kind)
            if boxes is None:
                if len(self._warm.boxes) >= _WARM_KINDS:
                    return
                boxes = self._warm.boxes[kind] = []
            while len(boxes) < self.warm and not self.uids.waiting:
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
        full = self._bwrap_argv(uid, limits, [], info_write, command, rlimits=False)
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
        init = await _await_sandbox_init(box.info_fd, 10.0)
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
            outcome.sandbox_init = init or _sandbox_init(box.info_fd)
        finally:
            os.close(box.info_fd)
            await self._release(box.uid, outcome.sandbox_init if outcome else None)
        return _result(outcome, [], limits)

    async def _discard(self, box: WarmSandbox) -> None:
        """Stop a warm sandbox that never got a job; its uid goes back to the pool."""
        _process.kill(box.proc, False)
        await asyncio.to_thread(box.proc.wait)
        sandbox_init = _sandbox_init(box.info_fd)
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

    def _nproc(self, uid: int, limits: Limits) -> int:
        """RLIMIT_NPROC for a run, so that ``limits.processes`` counts the run's own processes
        (its init included). Set by the init inside the sandbox's user namespace it counts just
        those (Linux >= 5.14 counts processes per user namespace). Set before bubblewrap by
        prlimit it also counts the outer bubblewrap and, when not root, the caller's own
        processes (the same uid): both are added."""
        if self.limits_in_init:
            return limits.processes
        outer = 1 if self.isolation == "bwrap" else 0
        return limits.processes + outer + (0 if self.as_root else len(_process.uid_processes(uid)))

    def _prefix(
        self, uid: int, limits: Limits, namespace: str | None = None, rlimits: bool = True
    ) -> list[str]:
        """The argv before bubblewrap (or the rlimits fallback's command): ``prlimit`` unless the
        init (or a warm sandbox's stub: ``rlimits=False``) sets the limits, then (as root) the
        drop to ``uid``: ``nsenter``'s, into the network namespace at ``namespace`` when there
        is one, else ``setpriv``'s."""
        prlimit = rlimits and not self.limits_in_init
        argv = prlimit_argv(limits, self._nproc(uid, limits)) if prlimit else []
        if namespace is not None:  # nsenter -G also drops the supplementary groups
            return [
                *argv,
                "nsenter",
                f"--net={namespace}",
                f"--setuid={uid}",
                f"--setgid={uid}",
                "--",
            ]
        if self.as_root:
            argv += [
                "setpriv",
                f"--reuid={uid}",
                f"--regid={uid}",
                "--clear-groups",
                "--no-new-privs",
                "--",
            ]
        return argv

    async def _run_bwrap(
        self,
        uid: int,
        argv: list[str],
        stdin: str | bytes | None,
        inputs: dict[str, bytes],
        wanted: list[str],
        limits: Limits,
    ) -> _process.Outcome:
        fds, flags = _input_files(inputs)
        channel_read, channel = None, None
        if wanted:
            channel_read, channel_write = os.pipe()
            os.fchown(channel_write, uid, uid)  # the sandbox reopens it through /proc as `uid`
            fds.append(channel_write)
            channel = f"/proc/self/fd/{channel_write}"
        # sh is the sandbox's pid 1 (--as-pid-1): bubblewrap's own init would leave a zombie
        # for the host's init to reap, holding a slot of the uid's process limit meanwhile.
        prologue = ulimit_prologue(limits, self._nproc(uid, limits)) if self.limits_in_init else ""
        init = ["/bin/sh", "-c", init_script(wanted, channel, prologue=prologue), "sh"]
        # bubblewrap writes the host pid of the sandbox's init here (closed inside the sandbox).
        info_read, info_write = os.pipe()
        fds.append(info_write)
        full = self._bwrap_argv(uid, limits, flags, info_write, [*init, *argv])
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
            outcome.sandbox_init = _sandbox_init(info_read)
        finally:
            os.close(info_read)
        return outcome

    def _bwrap_argv(
        self,
        uid: int,
        limits: Limits,
        flags: list[str],
        info_fd: int,
        command: list[str],
        rlimits: bool = True,
    ) -> list[str]:
        """The whole argv of a bubblewrap run of ``command`` as ``uid`` (see :meth:`_prefix`
        for ``rlimits``), with extra bubblewrap ``flags``; bubblewrap writes the sandbox init's
        host pid to ``info_fd``."""
        # No network: the uid's kept namespace (bubblewrap keeps it), else a new one per run.
        namespace = None if limits.network or not self.keeps_netns else netns.netns_path(uid)
        # The root bubblewrap builds is a tmpfs with no size limit: make it read-only last.
        return [
            *self._prefix(uid, limits, namespace, rlimits=rlimits),
            self.bwrap,
            *self._bwrap_flags(limits, keep_net=namespace is not None),
            *flags,
            "--info-fd",
            str(info_fd),
            "--remount-ro",
            "/",
            "--",
            *command,
        ]

    def _bwrap_flags(self, limits: Limits, keep_net: bool = False) -> list[str]:
        flags = [
            "--unshare-all",
            "--unshare-user",
            "--disable-userns",
            "--die-with-parent",
            "--new-session",
            "--as-pid-1",
            "--hostname",
            "sandbox",
        ]
        if limits.network or keep_net:
            flags += ["--share-net"]
        for path in _RO_SYSTEM:
            flags += ["--ro-bind", path, path]
        for link, target in _LINKS.items():
            if os.path.islink(link) or not os.path.exists(link):
                flags += ["--symlink", target, link]
            else:  # a system whose /lib is a real folder
                flags += ["--ro-bind", link, link]
        on_top = (*(_NET_FILES if limits.network else ()), *self.ro_binds)
        flags += ["--ro-bind", prepared_etc(on_top), "/etc"]
        for path in on_top:
            flags += ["--ro-bind-try", path, path]
        flags += ["--proc", "/proc", "--dev", "/dev"]
        flags += [
            "--size",
            str(limits.disk_mb << 20),
            "--tmpfs",
            WORKDIR,
            "--dir",
            f"{WORKDIR}/.tmp",
            "--symlink",
            f"{WORKDIR}/.tmp",
            "/tmp",
        ]
        flags += [
            "--clearenv",
            *[x for key, value in ENV.items() for x in ("--setenv", key, value)],
            "--chdir",
            WORKDIR,
        ]
        return flags

    async def _run_rlimits(
        self,
        uid: int,
        argv: list[str],
        stdin: str | bytes | None,
        inputs: dict[str, bytes],
        wanted: list[str],
        limits: Limits,
    ) -> _process.Outcome:
        with tempfile.TemporaryDirectory(prefix="envhub-sandbox-") as folder:
            root = Path(folder)
            for path, data in inputs.items():
                (root / path).parent.mkdir(parents=True, exist_ok=True)
                (root / path).write_bytes(data)
            if self.as_root:
                for path in [root, *root.rglob("*")]:
                    os.chown(path, uid, uid)
            env_argv = [
                "env",
                "-i",
                *[f"{k}={v}" for k, v in {**ENV, "HOME": folder, "TMPDIR": folder}.items()],
            ]
            # As root the run has a uid of its own, so its init may kill all that uid's processes.
            init = ["/bin/sh", "-c", init_script(kill_all=self.as_root), "sh"]
            outcome = await _process.execute(
                [*self._prefix(uid, limits), *env_argv, *init, *argv],
                stdin=as_bytes(stdin or b""),
                output_cap=limits.output_bytes,
                deadline=limits.wall_time,
                cwd=folder,
                new_session=True,
            )
            outcome.channel = _read_back(root, wanted)
            return outcome


_WARM_KINDS = 4
"""Kinds of Python run kept warm at most (the first ones seen)."""


_INSTANCES: weakref.WeakSet[LocalSandbox] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A forked child must not use its parent's warm sandboxes (they are the parent's
    children) nor its uids (the parent goes on using them): each sandbox forgets the first
    and claims a pool of its own."""
    _process.forget_pools()
    for box in list(_INSTANCES):
        box._warm.boxes.clear()
        box._zygotes = {}  # the parent's children, talking to the parent
        box._warm.lock = threading.RLock()
        box._in_flight = 0  # the parent's calls, which never end here
        step = 1 if box.as_root else 0
        box.uids = box._warm.uids = _process.uid_pool(box.uids.base, box.uids.size, step)


os.register_at_fork(after_in_child=_after_fork_in_child)


def _stop_zygotes(running: dict[tuple[str, ...], zygotes.Zygote]) -> None:
    """Stop a sandbox's zygotes (they start again when needed)."""
    for zygote in list(running.values()):
        zygote.stop()
    running.clear()


def shell_is_dash(shell: str = "/bin/sh") -> bool:
    """Whether ``shell`` is dash, whose ``ulimit`` builtin sets every limit a run needs with the
    units :func:`ulimit_prologue` uses (bash's ``ulimit -p`` is the pipe size, not processes)."""
    return os.path.basename(os.path.realpath(shell)) == "dash"


def ulimit_prologue(limits: Limits, nproc: int) -> str:
    """The same rlimits as :func:`prlimit_argv`, set by dash's ``ulimit`` in the sandbox's init
    before the command starts (KiB for memory, 512-byte blocks for file size); the run stops
    with status 125 if one cannot be set, so no command runs without its limits."""
    cpu = limits.cpu_seconds
    settings = [
        f"-v {limits.memory_mb * 1024}",
        f"-S -t {cpu}",  # soft first: a hard limit below the current soft one is refused
        f"-H -t {cpu + 1}",
        f"-f {limits.file_size_mb * 2048}",
        f"-p {nproc}",
        f"-n {limits.open_files}",
        "-c 0",
    ]
    setters = " && ".join(f"ulimit {setting}" for setting in settings)
    return f'{setters} || {{ echo "envhub sandbox: cannot set its limits" >&2; exit 125; }}\n'


def _sandbox_init(info_fd: int) -> int | None:
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


async def _await_sandbox_init(info_fd: int, wait: float) -> int | None:
    """:func:`_sandbox_init` once bubblewrap has written all of its JSON (in several writes),
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


def _input_files(inputs: dict[str, bytes]) -> tuple[list[int], list[str]]:
    """Each input file as a memfd bubblewrap copies into the sandbox (``--file FD DEST``)."""
    fds, flags, made = [], [], set()
    for path, data in inputs.items():
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            folder = "/".join(parts[:i])
            if folder not in made:
                made.add(folder)
                flags += ["--dir", f"{WORKDIR}/{folder}"]
        fd = os.memfd_create("envhub-input", 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
        fds.append(fd)
        flags += ["--file", str(fd), f"{WORKDIR}/{path}"]
    return fds, flags


def _read_back(root: Path, wanted: list[str]) -> bytes:
    found = {}
    if wanted == [ALL_FILES]:
        wanted = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    for path in wanted:
        target = root / path
        if target.is_file() and not target.is_symlink():
            found[path] = target.read_bytes()
    return frame(found)


def _result(outcome: _process.Outcome, wanted: list[str], limits: Limits) -> ExecResult:
    stdout = outcome.stdout.decode("utf-8", errors="replace")
    stderr = outcome.stderr.decode("utf-8", errors="replace")
    if outcome.killed_for:
        reason = outcome.killed_for
    else:
        reason = classify_exit(outcome.exit_code if outcome.exit_code is not None else 0, stderr)
    files = parse_outputs(outcome.channel, wanted) if wanted and not outcome.killed_for else {}
    return ExecResult(stdout, stderr, outcome.exit_code, reason, outcome.seconds, files)  # type: ignore[arg-type]
