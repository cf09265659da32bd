"""The e2b backend: runs in an e2b micro-VM through the official ``e2b`` SDK.

One VM serves many runs: it is created on first use (``Sandbox.create``, network off unless
``Limits.network``) and killed by :meth:`E2BSandbox.aclose`. Each run gets a fresh folder,
its stdin from a file that is deleted before the command starts, and the same rlimits as the
local backend, set by ``prlimit`` (:func:`~envhub.sandbox.base.prlimit_argv`); the wall time,
output limit and stop reasons are enforced here, on the host, exactly as for the local backend.

Differences from the local backend: runs share one VM (each in its own folder, as the VM's
unprivileged user), so isolation *between runs* is weaker; ``disk_mb`` is not enforced (only
``file_size_mb`` per file); the VM's own isolation replaces bubblewrap's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from envhub.errors import MissingDependencyError, SandboxError, SandboxUnavailableError
from envhub.sandbox.base import (
    Command,
    ExecResult,
    Files,
    Limits,
    Sandbox,
    as_argv,
    as_bytes,
    check_relative,
    prlimit_argv,
)
from envhub.sandbox.e2b_session import E2BSession
from envhub.sandbox.e2b_vm import execute, read_files, write_files

if TYPE_CHECKING:
    from envhub.sandbox.session import SessionPaths, Workspace

RUN_ROOT = "/tmp/envhub-runs"


class E2BSandbox(Sandbox):
    """Runs commands in an e2b micro-VM.

    Args:
        limits: Default limits of every run.
        template: e2b template of the VM (default: e2b's base template).
        api_key: e2b API key (default: ``E2B_API_KEY``).
        api_url: Where the SDK reaches e2b's API (see e2b's docs; tests point this and the
            next four at a local envd, ``tests/sandbox/envd_local.py``).
        sandbox_url: Where the SDK reaches the VM's envd.
        domain: e2b's domain.
        debug: e2b's debug flag.
        envd_port: Shorthand for ``sandbox_url=http://127.0.0.1:<port>``.
        http_version: The HTTP version the SDK speaks to envd.
        python: The Python inside the VM.
    """

    backend = "e2b"

    def __init__(
        self,
        limits: Limits | None = None,
        *,
        template: str | None = None,
        api_key: str | None = None,
        api_url: str | None = None,
        sandbox_url: str | None = None,
        domain: str | None = None,
        debug: bool | None = None,
        envd_port: int | None = None,
        http_version: str | None = None,
        python: str = "python3",
    ) -> None:
        super().__init__(limits, python=python)
        try:
            import e2b  # noqa: F401  (fail now, not at the first run)
        except ImportError as e:
            raise MissingDependencyError.for_extra("e2b", "e2b") from e
        self.template = template
        options = {
            "api_key": api_key,
            "api_url": api_url,
            "sandbox_url": sandbox_url,
            "domain": domain,
            "debug": debug,
            "http_version": http_version,
        }
        self.connection = {k: v for k, v in options.items() if v is not None}
        if sandbox_url is None and envd_port is not None:
            self.connection["sandbox_url"] = f"http://127.0.0.1:{envd_port}"
        self._vm: Any = None
        self._lock: asyncio.Lock | None = None

    async def _sandbox(self, network: bool) -> Any:
        if self._vm is None:
            from e2b import AsyncSandbox

            try:
                self._vm = await AsyncSandbox.create(
                    self.template, allow_internet_access=network, **self.connection
                )
            except Exception as e:
                raise SandboxError(f"cannot create an e2b sandbox: {type(e).__name__}: {e}") from e
        return self._vm

    async def arun(
        self,
        command: Command,
        *,
        stdin: str | bytes | None = None,
        files: Files | None = None,
        output_files: Sequence[str] = (),
        limits: Limits | None = None,
    ) -> ExecResult:
        """Run ``command`` in a fresh folder of the shared VM, creating the VM on first use.

        The inputs and stdin are uploaded, the command runs under ``prlimit`` with the run's
        limits, the output files are read back unless it timed out or hit the output limit, and
        the folder is removed afterwards. See :meth:`Sandbox.arun` for the arguments.

        Raises:
            SandboxError: The VM could not be created, or an e2b call failed.
        """
        limits = limits or self.limits
        argv = as_argv(command)
        inputs = {check_relative(p): as_bytes(d) for p, d in (files or {}).items()}
        wanted = [check_relative(p) for p in output_files]
        vm = await self._sandbox(limits.network)
        folder = f"{RUN_ROOT}/{uuid.uuid4().hex}"
        try:
            await write_files(vm, folder, {**inputs, ".stdin": as_bytes(stdin or b"")})
            result = await execute(vm, _wrapped(argv, limits), folder, limits)
            if wanted and result.stop_reason not in ("timeout", "output_limit"):
                result = _with_files(result, await read_files(vm, folder, wanted))
            return result
        except SandboxError:
            raise
        except Exception as e:
            raise SandboxError(f"e2b: {type(e).__name__}: {e}") from e
        finally:
            with contextlib.suppress(Exception):
                await vm.commands.run(f"rm -rf {shlex.quote(folder)}", timeout=30)

    def session(
        self,
        workspace: Workspace | str | os.PathLike[str] | None = None,
        *,
        limits: Limits | None = None,
        paths: SessionPaths | None = None,
    ) -> E2BSession:
        """A VM of its own for one episode, created on first use, with ``workspace``'s files
        uploaded into its folder (:mod:`envhub.sandbox.e2b_session`). Its session shows no
        other folder (:meth:`~envhub.sandbox.base.Sandbox.session_path_problem`): callers map
        such paths into the session's folder.

        Raises:
            SandboxUnavailableError: ``paths`` holds a path.
        """
        from envhub.sandbox.session import as_workspace

        if paths is not None and paths.all:
            raise SandboxUnavailableError(
                f"cannot show {paths.all[0]}: {self.session_path_problem(paths.all[0])}"
            )
        return E2BSession(self, as_workspace(workspace), limits or self.limits)

    async def aclose(self) -> None:
        """Kill the VM, if one was created; errors while killing it are ignored."""
        vm, self._vm = self._vm, None
        if vm is not None:
            with contextlib.suppress(Exception):
                await vm.kill()


def _wrapped(argv: list[str], limits: Limits) -> str:
    """The shell line that runs ``argv`` with the rlimits, stdin from a file that is gone
    before the command starts (the program cannot read the harness's input back)."""
    prlimit = prlimit_argv(limits, limits.processes)
    return f"exec < .stdin && rm -f .stdin && exec {shlex.join(prlimit + argv)}"


def _with_files(result: ExecResult, files: dict[str, bytes]) -> ExecResult:
    return ExecResult(
        result.stdout, result.stderr, result.exit_code, result.stop_reason, result.wall_time, files
    )
