"""What one sandbox call takes and gives back: its command, files and :class:`Limits`, its
:class:`ExecResult`, and the rlimits the limits become.

One call runs one command in a fresh, empty sandbox: input files are written into its working
folder (``/sandbox``), ``stdin`` is fed to it, and it comes back as an :class:`ExecResult`
(stdout, stderr, exit status, the output files asked for, wall time and why it stopped).
Nothing carries over from one call to the next. The interface that runs calls is
:class:`~envhub.sandbox.base.Sandbox` (which re-exports these names); its backends are
:class:`~envhub.sandbox.local.LocalSandbox` (bubblewrap + rlimits on this machine) and
:class:`~envhub.sandbox.e2b.E2BSandbox` (e2b micro-VMs); the same :class:`Limits` mean the same
thing on both. This module sits below the sandbox and its sessions, which both use it.

Why a run stopped (:attr:`ExecResult.stop_reason`):

    ok            the command exited by itself (any exit code; see ``exit_code``)
    timeout       it ran past ``wall_time`` or used up ``cpu_time`` and was killed
    memory        it ran out of memory (``memory_mb``)
    output_limit  it wrote more than ``output_bytes`` to stdout or stderr and was killed
    killed        a signal ended it (its own doing, or something outside the sandbox)
"""

from __future__ import annotations

import resource
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from envhub.errors import ConfigError

StopReason = Literal["ok", "timeout", "memory", "output_limit", "killed"]
STOP_REASONS: tuple[str, ...] = ("ok", "timeout", "memory", "output_limit", "killed")

WORKDIR = "/sandbox"
"""The sandbox's working folder: input files land here; relative output paths are read here."""

# What a program prints when the address-space limit stops it (Python, C++, glibc, the shell).
_MEMORY_MARKERS = ("MemoryError", "std::bad_alloc", "Cannot allocate memory", "out of memory")
SIGXCPU, SIGKILL = 24, 9

Command = str | Sequence[str]
Files = Mapping[str, str | bytes]


@dataclass(frozen=True)
class Limits:
    """What one run may use. ``None`` for ``cpu_time`` means "a second more than
    ``wall_time``": a backstop for many threads, never racing the wall clock for one.

    Attributes:
        wall_time: Seconds of real time before the run is killed (``timeout``).
        cpu_time: Seconds of CPU time (RLIMIT_CPU) before the run is killed (``timeout``).
        memory_mb: Address space per process (RLIMIT_AS), in MiB (``memory``).
        processes: Processes and threads alive at once in a run, its init included
            (RLIMIT_NPROC): a fork bomb stops here.
        file_size_mb: Largest file a process may write (RLIMIT_FSIZE); bigger writes fail (EFBIG).
        output_bytes: Bytes of stdout and of stderr kept; more is ``output_limit`` and a kill.
        disk_mb: Size of the writable scratch space (working folder and ``/tmp`` together).
        open_files: File descriptors per process (RLIMIT_NOFILE).
        network: Allow network access (off: the sandbox has only its own loopback).
    """

    wall_time: float = 10.0
    cpu_time: float | None = None
    memory_mb: int = 512
    processes: int = 32
    file_size_mb: int = 16
    output_bytes: int = 1 << 20
    disk_mb: int = 64
    open_files: int = 256
    network: bool = False

    def __post_init__(self) -> None:
        for name in (
            "wall_time",
            "memory_mb",
            "processes",
            "file_size_mb",
            "output_bytes",
            "disk_mb",
            "open_files",
        ):
            if not getattr(self, name) > 0:
                raise ConfigError(
                    f"sandbox limit {name} must be positive, got {getattr(self, name)!r}"
                )
        if self.cpu_time is not None and not self.cpu_time > 0:
            raise ConfigError(
                f"sandbox limit cpu_time must be positive or None, got {self.cpu_time!r}"
            )

    @property
    def cpu_seconds(self) -> int:
        """Whole CPU seconds for RLIMIT_CPU (rounded up, at least 1). Without ``cpu_time``,
        one more than ``wall_time``: a single thread then always meets the wall clock first
        (``timeout``, killed by the host), however early its interpreter started."""
        if self.cpu_time is None:
            return max(1, int(-(-self.wall_time // 1))) + 1
        return max(1, int(-(-self.cpu_time // 1)))

    def with_(self, **changes: Any) -> Limits:
        """A copy with some limits changed."""
        return replace(self, **changes)


@dataclass(frozen=True)
class ExecResult:
    """What one run did.

    Attributes:
        stdout: Standard output (decoded as UTF-8, invalid bytes replaced), at most
            ``output_bytes``.
        stderr: Standard error, likewise.
        exit_code: The exit status, or ``128 + signal`` when a signal ended it; ``None`` when
            the sandbox killed it before it ended (``timeout``, ``output_limit``).
        stop_reason: Why it stopped (see the module docstring).
        wall_time: Seconds from start to end, sandbox set-up included.
        files: Output files that were asked for and exist: path -> bytes.
    """

    stdout: str
    stderr: str
    exit_code: int | None
    stop_reason: StopReason
    wall_time: float
    files: dict[str, bytes] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when the command exited by itself with status 0."""
        return self.stop_reason == "ok" and self.exit_code == 0

    def describe(self) -> str:
        """One line for logs and tool replies: ``exit 1``, ``timeout after 2.0 s``, ..."""
        if self.stop_reason == "ok":
            return f"exit {self.exit_code}"
        if self.stop_reason == "timeout":
            return f"timeout after {self.wall_time:.1f} s"
        if self.stop_reason == "killed" and self.exit_code is not None and self.exit_code > 128:
            return f"killed by signal {self.exit_code - 128}"
        return self.stop_reason.replace("_", " ")


def classify_exit(exit_code: int, stderr: str) -> StopReason:
    """Why a command that ended on its own stopped, from its status and its last words.

    ``128 + SIGXCPU`` (or ``SIGKILL`` after it) is the CPU limit; a memory-error message at the
    end of stderr is the memory limit; any other ``128 + n`` is a signal. The program writes its
    own stderr, so it can fake ``memory``: the stop reason is a diagnosis, never a reward input.
    """
    tail = stderr[-400:]
    if exit_code == 128 + SIGXCPU:
        return "timeout"
    if exit_code != 0 and any(marker in tail for marker in _MEMORY_MARKERS):
        return "memory"
    if exit_code > 128:
        return "killed"
    return "ok"


def as_argv(command: Command) -> list[str]:
    """A command as an argument list: a string runs through ``/bin/sh -c``."""
    if isinstance(command, str):
        return ["/bin/sh", "-c", command]
    argv = [str(part) for part in command]
    if not argv:
        raise ConfigError("a sandbox command needs at least a program name")
    return argv


def check_relative(path: str) -> str:
    """A file path inside the working folder: relative, no ``..``, no empty parts."""
    parts = path.split("/")
    if path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ConfigError(
            f"sandbox file paths must be relative and stay inside {WORKDIR}, got {path!r}"
        )
    return path


def as_bytes(data: str | bytes) -> bytes:
    """``data`` as bytes: text is encoded as UTF-8, bytes-like data copied to ``bytes``."""
    return data.encode("utf-8") if isinstance(data, str) else bytes(data)


def quote(argv: Sequence[str]) -> str:
    """An argument list as one shell command line."""
    return shlex.join(argv)


def rlimits(limits: Limits, nproc: int) -> list[tuple[int, int, int]]:
    """A run's rlimits as ``(resource, soft, hard)``: the one place :class:`Limits` become
    rlimits. Every way of setting them (``prlimit``, dash's ``ulimit``, the warm stub's and
    the session init's ``setrlimit``) writes out this list, in this order.

    Args:
        limits: The run's limits.
        nproc: RLIMIT_NPROC, which depends on where the limit is set and what it then counts
            (:func:`~envhub.sandbox.jail.nproc`), so the caller gives it.
    """
    mib, cpu = 1 << 20, limits.cpu_seconds
    return [
        (resource.RLIMIT_AS, limits.memory_mb * mib, limits.memory_mb * mib),
        # The hard limit a second later: SIGXCPU at the soft one, SIGKILL if it is ignored.
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_FSIZE, limits.file_size_mb * mib, limits.file_size_mb * mib),
        (resource.RLIMIT_NPROC, nproc, nproc),
        (resource.RLIMIT_NOFILE, limits.open_files, limits.open_files),
        (resource.RLIMIT_CORE, 0, 0),
    ]


_PRLIMIT_NAMES = {
    resource.RLIMIT_AS: "as",
    resource.RLIMIT_CPU: "cpu",
    resource.RLIMIT_FSIZE: "fsize",
    resource.RLIMIT_NPROC: "nproc",
    resource.RLIMIT_NOFILE: "nofile",
    resource.RLIMIT_CORE: "core",
}
"""``prlimit``'s option for each resource :func:`rlimits` sets."""


def prlimit_argv(limits: Limits, nproc: int) -> list[str]:
    """``prlimit`` setting a run's rlimits (:func:`rlimits`) before it execs the rest of the
    argv."""
    argv = ["prlimit"]
    for kind, soft, hard in rlimits(limits, nproc):
        # One value sets both limits; ``soft:hard`` only where they differ.
        value = f"{soft}" if soft == hard else f"{soft}:{hard}"
        argv.append(f"--{_PRLIMIT_NAMES[kind]}={value}")
    return [*argv, "--"]
