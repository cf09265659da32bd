"""Sandboxed code execution: one :class:`Sandbox` interface, a local and an e2b backend.

    from envhub.sandbox import LocalSandbox, Limits
    result = LocalSandbox().run_python("print(1)")   # ExecResult(stdout="1\\n", exit_code=0, ...)

Threat model (what a run is protected against, and what not): see
:mod:`envhub.sandbox.threat_model`.
"""

from __future__ import annotations

from envhub.sandbox.base import STOP_REASONS, WORKDIR, ExecResult, Limits, Sandbox, StopReason
from envhub.sandbox.local import LocalSandbox, bwrap_problem
from envhub.sandbox.session import Session, Workspace

__all__ = [
    "STOP_REASONS",
    "WORKDIR",
    "ExecResult",
    "Limits",
    "LocalSandbox",
    "Sandbox",
    "Session",
    "StopReason",
    "Workspace",
    "bwrap_problem",
    "make_sandbox",
]


def make_sandbox(backend: str = "local", **kwargs: object) -> Sandbox:
    """A sandbox by backend name: ``"local"`` (bubblewrap) or ``"e2b"``.

    Raises:
        ConfigError: Unknown backend.
        SandboxUnavailableError: The backend cannot run here.
    """
    from envhub.errors import ConfigError

    if backend == "local":
        return LocalSandbox(**kwargs)  # type: ignore[arg-type]
    if backend == "e2b":
        from envhub.sandbox.e2b import E2BSandbox

        return E2BSandbox(**kwargs)  # type: ignore[arg-type]
    raise ConfigError(f"unknown sandbox backend {backend!r}; choose 'local' or 'e2b'")
