"""Sessions: one sandbox that lives for an episode, and the workspaces sessions start from.

A :class:`Session` is what a terminal or repository task needs: commands run one after another
in the same working folder (``/sandbox``) and see each other's files; processes a command
leaves running (``cmd &``, daemons) live on, counted against the session's process limit, until
the session ends. Each call still has its own :class:`~envhub.sandbox.base.Limits` (wall time,
output, memory, CPU, file size). Ending the session (:meth:`Session.aclose`, or the caller
dying, however it dies) ends every process of it and drops every file it wrote.

A :class:`Workspace` is a prepared directory tree: many sessions start from one (a group's
samples from one repository state), each seeing its own copy-on-write view of it; their writes
never reach the workspace nor each other.

    from envhub.sandbox import LocalSandbox, Workspace

    workspace = Workspace.from_files({"app.py": "print('hi')\\n"})
    async with LocalSandbox().session(workspace) as session:
        await session.arun("python3 app.py > out.txt")
        assert await session.read_file("out.txt") == b"hi\\n"

A session can also show folders at paths a task expects (:class:`SessionPaths`): the working
folder again at, say, ``/app``, and empty writable folders such as ``/tests``. A backend that
cannot (:meth:`Sandbox.session_path_problem <envhub.sandbox.base.Sandbox.session_path_problem>`
says why) refuses them; its callers map such paths into ``/sandbox`` themselves.

Backends: :class:`~envhub.sandbox.local_session.LocalSession` (bubblewrap, an overlay of the
workspace; shows :class:`SessionPaths`) and :class:`~envhub.sandbox.e2b_session.E2BSession` (one
e2b sandbox per session; shows none).
"""

from __future__ import annotations

import os
import posixpath
import shutil
import socket
import tempfile
import weakref
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envhub._async import run_sync
from envhub.errors import ConfigError, SandboxError, SandboxUnavailableError
from envhub.sandbox.calls import WORKDIR, Command, ExecResult, Limits, as_bytes, check_relative

FILE_MODE, FOLDER_MODE = 0o644, 0o755
"""Modes :meth:`Workspace.from_files` gives its files and folders."""


class Workspace:
    """A prepared directory tree that sessions start from (read-only to them; each session sees
    its own copy-on-write view).

    Inside a local session the files of the workspace's owner (the owner of its top folder)
    appear owned by the session's uid, so a session can change them (in its own copy) as the
    owner could: ``chmod``, tools that check ownership (``git``). Files of other owners appear
    owned by ``nobody``. Every file must be readable by its owner.

    Args:
        path: An existing host directory. Keep it unchanged while sessions use it.

    Raises:
        ConfigError: ``path`` is not a directory.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).resolve()
        if not self.path.is_dir():
            raise ConfigError(f"a workspace must be an existing directory, got {str(path)!r}")
        self._owned = False

    @classmethod
    def from_files(
        cls, files: Mapping[str, str | bytes], *, root: str | os.PathLike[str] | None = None
    ) -> Workspace:
        """A workspace holding ``files`` (relative path -> contents), written into a fresh
        temporary directory (under ``root`` when given). It is removed when the workspace is
        collected, or by :meth:`remove`.

        Raises:
            ConfigError: A path is absolute or leaves the directory (``..``).
        """
        checked = {check_relative(path): as_bytes(data) for path, data in files.items()}
        folder = Path(tempfile.mkdtemp(prefix="envhub-workspace-", dir=root))
        try:
            for path, data in checked.items():
                target = folder / path
                _make_folders(folder, target.parent)
                target.write_bytes(data)
                target.chmod(FILE_MODE)
            folder.chmod(FOLDER_MODE)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        workspace = cls(folder)
        workspace._owned = True
        weakref.finalize(workspace, shutil.rmtree, folder, True)
        return workspace

    def remove(self) -> None:
        """Delete the directory, if :meth:`from_files` made it (a no-op otherwise)."""
        if self._owned:
            shutil.rmtree(self.path, ignore_errors=True)

    def __repr__(self) -> str:
        return f"Workspace({str(self.path)!r})"


def _make_folders(root: Path, folder: Path) -> None:
    """``folder`` and its parents below ``root``, with :data:`FOLDER_MODE`."""
    missing = []
    while folder != root and not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        path.mkdir()
        path.chmod(FOLDER_MODE)


def as_workspace(workspace: Workspace | str | os.PathLike[str] | None) -> Workspace | None:
    """``workspace`` as a :class:`Workspace` (a path becomes one; ``None`` stays: empty)."""
    if workspace is None or isinstance(workspace, Workspace):
        return workspace
    return Workspace(workspace)


@dataclass(frozen=True)
class SessionPaths:
    """Folders a session shows at absolute paths of the caller's choosing, besides ``/sandbox``
    and ``/tmp`` (what a task written for a container expects: a Harbor task's ``/app``,
    ``/tests``, ``/solution``). Each path is absolute and normalized, not ``/``, and none lies
    inside another; which paths a backend can show, it says
    (:meth:`~envhub.sandbox.base.Sandbox.session_path_problem`).

    Raises:
        ConfigError: A path that is relative, not normalized, ``/``, repeated, or inside another.
    """

    workdir: tuple[str, ...] = ()
    """Paths where the working folder appears too: the same files as ``/sandbox``."""
    folders: tuple[str, ...] = ()
    """Empty folders the session's commands may write: on the session's own storage (counted
    in ``disk_mb``), dropped with it."""

    def __post_init__(self) -> None:
        shown = self.all
        for path in shown:
            if not path.startswith("/") or posixpath.normpath(path) != path or path == "/":
                raise ConfigError(f"a session path must be absolute and normalized, got {path!r}")
        for path in shown:
            around = [p for p in shown if p != path and (p + "/").startswith(path + "/")]
            if around or shown.count(path) > 1:
                raise ConfigError(f"session paths must not repeat or nest: {path!r} in {shown}")

    @property
    def all(self) -> tuple[str, ...]:
        """Every path shown: :attr:`workdir`, then :attr:`folders`."""
        return (*self.workdir, *self.folders)


def sandbox_path(path: str) -> str:
    """``path`` as an absolute path under ``/sandbox``: relative to it, or absolute under it.

    Raises:
        ConfigError: The path leaves ``/sandbox``.
    """
    full = posixpath.normpath(posixpath.join(WORKDIR, path))
    if full != WORKDIR and not full.startswith(WORKDIR + "/"):
        raise ConfigError(f"session file paths must stay inside {WORKDIR}, got {path!r}")
    return full


class Session(ABC):
    """One episode's sandbox: commands run one after another in the same workspace (cwd
    ``/sandbox``) and see each other's files.

    Use it as an async (or plain) context manager, or call :meth:`aclose` at the end: that
    ends every process of the session and drops every file it wrote. Each call runs under
    :attr:`limits` (its ``wall_time`` can be changed per call); ``processes`` counts every
    process of the session at once (those left running by earlier calls too), ``disk_mb`` all
    the files it wrote.
    """

    limits: Limits
    """The limits of every call (``disk_mb``, ``network`` and ``processes`` hold for the
    whole session)."""
    writable_roots: tuple[str, ...] | None = None
    """Every folder the session's commands can write to, when the backend confines them
    (``None``: anywhere, as far as envhub knows); what
    :func:`~envhub.sandbox.digest.files_digest` hashes."""

    @abstractmethod
    async def arun(
        self,
        command: Command,
        *,
        stdin: str | bytes | None = None,
        wall_time: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        """Run ``command`` in the session and wait until it exits (not for processes it left
        running: output they write after that is dropped; redirect it to a file).

        Args:
            command: An argument list, or a string for ``/bin/sh -c``.
            stdin: Fed to the command's standard input (it sees end-of-file after it).
            wall_time: Seconds before it is killed (with its process group): ``timeout``.
            env: Variables added to the sandbox's environment for this call.

        Raises:
            SandboxError: The session is closed, or broke (not the command: a failing command
                is a result).
        """

    def call_limits(self, wall_time: float | None) -> Limits:
        """The limits of one call: the session's, with the call's ``wall_time`` if it gives
        one."""
        return self.limits if wall_time is None else self.limits.with_(wall_time=wall_time)

    async def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        """The contents of a file, relative to ``/sandbox`` (or absolute under it).

        Raises:
            FileNotFoundError: No such file.
            IsADirectoryError: It is a folder.
            SandboxError: It is larger than ``max_bytes`` (default: ``limits.output_bytes``).
        """
        full = sandbox_path(path)
        cap = max_bytes or self.limits.output_bytes
        result = await self._file_command(_READ, full, None, cap)
        if result.stop_reason == "output_limit":
            raise SandboxError(f"{full} is larger than {cap} bytes; pass a larger max_bytes")
        _raise_file_error(result, full)
        return result.stdout.encode("utf-8", "surrogateescape")

    async def write_file(self, path: str, data: str | bytes) -> None:
        """Create or overwrite a file, relative to ``/sandbox`` (or absolute under it), with
        its parent folders.

        Raises:
            IsADirectoryError: It is a folder.
            SandboxError: It could not be written (the disk is full, say).
        """
        full = sandbox_path(path)
        result = await self._file_command(_WRITE, full, as_bytes(data), 1 << 16)
        _raise_file_error(result, full)

    async def _file_command(
        self, script: str, path: str, stdin: bytes | None, cap: int
    ) -> ExecResult:
        """Run a file helper ``script`` on ``path`` (the backend may run it its own way)."""
        return await self._run_helper(["/bin/sh", "-c", script, "sh", path], stdin, cap)

    @abstractmethod
    async def _run_helper(self, argv: list[str], stdin: bytes | None, cap: int) -> ExecResult:
        """Run a helper command of the session itself, keeping ``cap`` bytes of stdout whose
        bytes come back undecoded (``surrogateescape``)."""

    @abstractmethod
    async def aclose(self) -> None:
        """End every process of the session and drop its files. Safe to call twice."""

    async def akill_processes(self) -> None:
        """End every process the session's calls left running; the session stays usable (run
        it before a verifier: what the model left running must not touch what it reads)."""
        await self.arun(["/bin/sh", "-c", "kill -9 -1 2>/dev/null; true"])

    async def alisten(self, port: int) -> socket.socket:
        """A TCP socket listening on ``127.0.0.1:port`` inside the session, accepted by the
        caller on the host: a program in the session can reach what the caller serves there
        (an agent, its model endpoint) and nothing else, the session keeping no network. Close
        it before the session ends.

        Raises:
            SandboxUnavailableError: The backend cannot do it (a remote sandbox).
        """
        raise SandboxUnavailableError(
            f"{type(self).__name__} cannot serve the host into its sandbox; use the local "
            "(bubblewrap) backend for programs that call back to this machine"
        )

    def run(self, command: Command, **kwargs: Any) -> ExecResult:
        """Synchronous :meth:`arun`."""
        return run_sync(self.arun(command, **kwargs))

    def close(self) -> None:
        """Synchronous :meth:`aclose`."""
        run_sync(self.aclose())

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# Exit 102: no such file; 103: a folder; 104: not a regular file (statuses no shell error
# uses). `cat`, `mkdir` and the shell report anything else.
_READ = (
    'if [ -d "$1" ]; then exit 103; elif [ ! -e "$1" ]; then exit 102; '
    'elif [ ! -f "$1" ]; then exit 104; fi; exec cat -- "$1"'
)
_WRITE = 'if [ -d "$1" ]; then exit 103; fi; mkdir -p -- "$(dirname -- "$1")" && exec cat > "$1"'


def _raise_file_error(result: ExecResult, path: str) -> None:
    """Raise what a file helper's result means, if it failed."""
    if result.ok:
        return
    if result.exit_code == 102:
        raise FileNotFoundError(2, "No such file in the session", path)
    if result.exit_code == 103:
        raise IsADirectoryError(21, "A folder, not a file", path)
    if result.exit_code == 104:
        raise SandboxError(f"{path} is not a regular file")
    raise SandboxError(f"{path}: {result.describe()}: {result.stderr.strip()[-300:]}")
