"""The ``Sandbox`` interface: run a program or a command on untrusted input, with limits.

One call runs one command in a fresh, empty sandbox (see :mod:`envhub.sandbox.calls` for what a
call takes and gives back: :class:`Limits`, :class:`ExecResult` and why a run stopped). Backends:
:class:`~envhub.sandbox.local.LocalSandbox` (bubblewrap + rlimits on this machine) and
:class:`~envhub.sandbox.e2b.E2BSandbox` (e2b micro-VMs); the same :class:`Limits` mean the same
thing on both. A sandbox's sessions (:meth:`Sandbox.session`) are in :mod:`envhub.sandbox.session`.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from envhub._async import run_sync
from envhub.sandbox.calls import (
    STOP_REASONS,
    WORKDIR,
    Command,
    ExecResult,
    Files,
    Limits,
    StopReason,
    as_argv,
    as_bytes,
    check_relative,
    classify_exit,
    prlimit_argv,
    quote,
    rlimits,
)

if TYPE_CHECKING:
    from envhub.sandbox.session import Session, SessionPaths, Workspace

__all__ = [
    "Command",
    "ExecResult",
    "Files",
    "Limits",
    "STOP_REASONS",
    "Sandbox",
    "StopReason",
    "WORKDIR",
    "as_argv",
    "as_bytes",
    "check_relative",
    "classify_exit",
    "prlimit_argv",
    "quote",
    "rlimits",
]


class Sandbox(ABC):
    """Runs untrusted commands, each in a fresh sandbox, with :class:`Limits`.

    Backends implement :meth:`arun`; everything else derives from it. A sandbox object is a
    factory of runs (and may hold a pool of workers): use it from many coroutines at once.

    Args:
        limits: Default limits of every run (each call may pass its own).
        python: The Python interpreter inside the sandbox, for :meth:`arun_python`.
    """

    backend: str = "sandbox"

    def __init__(self, limits: Limits | None = None, *, python: str = "python3") -> None:
        self.limits = limits or Limits()
        self.python = python

    @abstractmethod
    async def arun(
        self,
        command: Command,
        *,
        stdin: str | bytes | None = None,
        files: Files | None = None,
        output_files: Sequence[str] = (),
        limits: Limits | None = None,
    ) -> ExecResult:
        """Run ``command`` in a fresh sandbox.

        Args:
            command: An argument list, or a string for ``/bin/sh -c``.
            stdin: Fed to the command's standard input (it sees end-of-file after it).
            files: Files to create in the working folder first: relative path -> contents.
            output_files: Relative paths to read back after the command ends.
            limits: Limits of this run (default: the sandbox's).

        Raises:
            SandboxError: The sandbox itself failed (not the command: a failing command is a
                result). :class:`~envhub.errors.SandboxUnavailableError` when it cannot start.
        """

    async def arun_python(
        self,
        code: str,
        *,
        stdin: str | bytes | None = None,
        files: Files | None = None,
        limits: Limits | None = None,
    ) -> ExecResult:
        """Run a Python program (``main.py`` in the working folder)."""
        return await self.arun(
            [self.python, "-I", "main.py"],
            stdin=stdin,
            files={**(files or {}), "main.py": code},
            limits=limits,
        )

    def run(self, command: Command, **kwargs: Any) -> ExecResult:
        """Synchronous :meth:`arun`."""
        return run_sync(self.arun(command, **kwargs))

    def run_python(self, code: str, **kwargs: Any) -> ExecResult:
        """Synchronous :meth:`arun_python`."""
        return run_sync(self.arun_python(code, **kwargs))

    def session(
        self,
        workspace: Workspace | str | os.PathLike[str] | None = None,
        *,
        limits: Limits | None = None,
        paths: SessionPaths | None = None,
    ) -> Session:
        """A sandbox that lives for an episode, its working folder starting as ``workspace``
        (:mod:`envhub.sandbox.session`); ``limits`` default to the sandbox's; ``paths``: more
        folders it shows (where :meth:`session_path_problem` has none).

        Raises:
            SandboxUnavailableError: This backend has no sessions (here), or cannot show
                ``paths``.
        """
        from envhub.errors import SandboxUnavailableError

        raise SandboxUnavailableError(f"the {self.backend} sandbox backend has no sessions")

    def session_path_problem(self, path: str) -> str | None:
        """Why this backend's sessions cannot show a folder at ``path``
        (:class:`~envhub.sandbox.session.SessionPaths`), or ``None`` when they can. By default
        they show none: callers map such paths into ``/sandbox`` themselves."""
        return f"{self.backend} sessions show no folders but {WORKDIR} and /tmp"

    async def aclose(self) -> None:  # noqa: B027 - an optional hook, a no-op by default
        """Release the backend's resources (a remote sandbox, say). Safe to call twice."""

    def close(self) -> None:
        """Synchronous :meth:`aclose`."""
        run_sync(self.aclose())

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.limits!r})"
