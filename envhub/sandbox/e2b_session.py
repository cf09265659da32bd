"""The e2b backend's session: one e2b sandbox (a micro-VM) per episode, through the e2b SDK.

An :class:`E2BSession` creates its own VM on first use (network off unless
``Limits.network``), uploads the workspace's files into a folder of it (:data:`ROOT`), and
runs each call there with the call's rlimits (``prlimit``) and stdin from a file that is
removed before the command starts, as :class:`~envhub.sandbox.e2b.E2BSandbox` runs do; the
wall time and output limit are enforced on the host. :meth:`~E2BSession.aclose` kills the VM
with everything in it.

Differences from a local session: the VM is the isolation (its own kernel); ``disk_mb`` is not
enforced (only ``file_size_mb`` per file); the workspace is uploaded (a copy, not
copy-on-write); the process limit counts the VM user's processes, those earlier calls left
running too; paths given to :meth:`~envhub.sandbox.session.Session.read_file` and
:meth:`~envhub.sandbox.session.Session.write_file` are relative to the session's folder (a
folder there is reported as missing, not as a folder).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from envhub.errors import SandboxError
from envhub.sandbox.base import (
    WORKDIR,
    Command,
    ExecResult,
    Limits,
    as_argv,
    as_bytes,
    prlimit_argv,
)
from envhub.sandbox.e2b_vm import execute, write_files
from envhub.sandbox.session import Session, Workspace, sandbox_path

ROOT = "/tmp/envhub-sessions"
"""Where each session's folder is made in its VM."""


class E2BHost(Protocol):
    """What an :class:`E2BSession` uses of the sandbox that starts it: an
    :class:`~envhub.sandbox.e2b.E2BSandbox` (whose module imports this one, never the reverse)."""

    template: str | None
    connection: dict[str, Any]


class E2BSession(Session):
    """One episode's e2b VM (see the module docstring). Made by
    :meth:`E2BSandbox.session <envhub.sandbox.e2b.E2BSandbox.session>`.

    Args:
        sandbox: The e2b sandbox whose template and connection settings it uses.
        workspace: Files uploaded into the session's folder first (none when ``None``).
        limits: The limits of every call.
    """

    def __init__(self, sandbox: E2BHost, workspace: Workspace | None, limits: Limits) -> None:
        self.sandbox, self.workspace, self.limits = sandbox, workspace, limits
        self.folder = f"{ROOT}/{uuid.uuid4().hex}"
        """The session's working folder in its VM."""
        self._vm: Any = None
        self._closed = False

    async def arun(
        self,
        command: Command,
        *,
        stdin: str | bytes | None = None,
        wall_time: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        """Run ``command`` in the session's folder of its VM (see :meth:`Session.arun`)."""
        limits = self.call_limits(wall_time)
        return await self._run(as_argv(command), as_bytes(stdin or b""), env or {}, limits)

    async def read_file(self, path: str, *, max_bytes: int | None = None) -> bytes:
        """A file of the session's folder, through the VM's file API (see
        :meth:`Session.read_file`)."""
        vm, relative = await self._started(), _relative(path)
        try:
            data = bytes(await vm.files.read(f"{self.folder}/{relative}", format="bytes"))
        except Exception as e:
            if type(e).__name__ in ("NotFoundException", "FileNotFoundException"):
                raise FileNotFoundError(2, "No such file in the session", path) from None
            raise SandboxError(f"e2b: cannot read {path}: {type(e).__name__}: {e}") from e
        cap = max_bytes or self.limits.output_bytes
        if len(data) > cap:
            raise SandboxError(f"{path} is larger than {cap} bytes; pass a larger max_bytes")
        return data

    async def write_file(self, path: str, data: str | bytes) -> None:
        """Write a file of the session's folder, through the VM's file API."""
        vm = await self._started()
        try:
            await write_files(vm, self.folder, {_relative(path): as_bytes(data)})
        except Exception as e:
            raise SandboxError(f"e2b: cannot write {path}: {type(e).__name__}: {e}") from e

    async def _run_helper(self, argv: list[str], stdin: bytes | None, cap: int) -> ExecResult:
        return await self._run(argv, stdin or b"", {}, self.limits.with_(output_bytes=cap))

    async def aclose(self) -> None:
        """Kill the session's VM (errors while killing it are ignored). Safe to call twice."""
        self._closed = True
        vm, self._vm = self._vm, None
        if vm is not None:
            with contextlib.suppress(Exception):
                await vm.kill()

    async def __aenter__(self) -> E2BSession:
        await self._started()
        return self

    async def _run(
        self, argv: list[str], stdin: bytes, env: Mapping[str, str], limits: Limits
    ) -> ExecResult:
        vm = await self._started()
        stdin_file = f".envhub-stdin-{uuid.uuid4().hex}"
        exports = "".join(f"export {k}={shlex.quote(v)} && " for k, v in env.items() if k)
        line = (
            f"exec < {stdin_file} && rm -f {stdin_file} && {exports}"
            f"exec {shlex.join(prlimit_argv(limits, limits.processes) + argv)}"
        )
        try:
            await write_files(vm, self.folder, {stdin_file: stdin})
            return await execute(vm, line, self.folder, limits)
        except SandboxError:
            raise
        except Exception as e:
            raise SandboxError(f"e2b: {type(e).__name__}: {e}") from e

    async def _started(self) -> Any:
        """The session's VM, created (with the workspace uploaded) on first use."""
        if self._closed:
            raise SandboxError("the session is closed")
        if self._vm is None:
            from e2b import AsyncSandbox

            try:
                vm = await AsyncSandbox.create(
                    self.sandbox.template,
                    allow_internet_access=self.limits.network,
                    **self.sandbox.connection,
                )
            except Exception as e:
                raise SandboxError(f"cannot create an e2b sandbox: {type(e).__name__}: {e}") from e
            try:
                await vm.commands.run(f"mkdir -p {shlex.quote(self.folder)}", timeout=60)
                files = _files_of(self.workspace.path) if self.workspace else {}
                if files:
                    await write_files(vm, self.folder, files)
            except BaseException:
                with contextlib.suppress(Exception):
                    await vm.kill()
                raise
            self._vm = vm
        return self._vm


def _relative(path: str) -> str:
    """``path`` (under ``/sandbox``, or relative to it) relative to the session's folder."""
    full = sandbox_path(path)
    return full[len(WORKDIR) + 1 :] or "."


def _files_of(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder``: relative path -> contents (links are followed)."""
    files = {}
    for parent, _, names in os.walk(folder):
        for name in names:
            full = Path(parent, name)
            if full.is_file():
                files[str(full.relative_to(folder))] = full.read_bytes()
    return files
