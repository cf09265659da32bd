"""What starting a harness program takes and gives back, shared by the ways a program runs
(:mod:`~envhub.harness.programs` in this process's host, :mod:`~envhub.harness.sandboxed` in the
episode's session)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from envhub.harness.wire import POLICY_MODEL

STDERR_TAIL = 2000
"""Characters of a failed command's stderr kept in its error message."""


@dataclass(frozen=True)
class Launch:
    """What a program is started with."""

    base_url: str
    api_key: str
    task: dict[str, Any]
    prompt: str
    """The task as text (the env's :meth:`~envhub.harness.HarnessEnv.task_text`)."""
    model: str = POLICY_MODEL
    timeout: float | None = None
    """Seconds the program may run; a ``client`` handed to it waits as long for a reply."""
    session: Any = None
    """The episode's sandbox session (a :class:`~envhub.sandbox.Session`) when the env has a
    sandbox: a command runs in it, a function may take it (``session``) to run its tools
    there."""


@dataclass
class ProgramResult:
    """What a program returned: a callable's return value, or a command's stdout and status."""

    output: Any = None
    exit_code: int | None = None


class ProgramError(Exception):
    """A program that did not return normally; ``kind`` says how."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
