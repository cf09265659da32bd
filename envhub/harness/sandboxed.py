"""A command program run inside the episode's sandbox session, with the endpoint and nothing
else within its reach.

The session keeps no network. The host listens on the endpoint's own port *inside* the
session's network namespace (:meth:`~envhub.sandbox.Session.alisten`) and pipes each
connection it accepts there to the endpoint, so the program's ``OPENAI_BASE_URL`` is the same
URL as outside, and every other address stays unreachable. The command gets the sandbox's
clean environment plus the three ``OPENAI_*`` variables and the program's own ``env``; its
files are the session's, which the env's rewards can read after it ends
(``state.data["session"]``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Sequence
from typing import Protocol
from urllib.parse import urlsplit

from envhub.harness.launch import STDERR_TAIL, Launch, ProgramError, ProgramResult

GRACE = 5.0
"""Seconds the session's own limit on the command runs past the program's deadline: the env's
deadline ends it first, and records it as a timeout."""
_CHUNK = 1 << 16


class SessionCommand(Protocol):
    """What :func:`run_in_session` needs of a command program
    (:class:`~envhub.harness.programs.CommandProgram` is one)."""

    cwd: str | None
    task_input: str

    def argv_for(self, launch: Launch) -> Sequence[str]:
        """The command line for ``launch``."""
        ...

    def variables(self, launch: Launch) -> dict[str, str]:
        """The environment variables a run adds."""
        ...

    def describe(self) -> str:
        """The program as error messages name it."""
        ...


async def run_in_session(program: SessionCommand, launch: Launch) -> ProgramResult:
    """Run ``program``'s command in ``launch.session`` (see the module doc).

    Raises:
        ProgramError: It exited non-zero (``exit``), or the sandbox stopped it (``crash``:
            out of memory, over its output limit, killed).
        TimeoutError: The sandbox's time limit stopped it.
    """
    session = launch.session
    port = urlsplit(launch.base_url).port
    assert session is not None and port is not None
    server = await asyncio.start_server(
        functools.partial(_pipe, port), sock=await session.alisten(port)
    )
    argv = program.argv_for(launch)
    if program.cwd:
        argv = ["/bin/sh", "-c", 'cd "$1" && shift && exec "$@"', "sh", program.cwd, *argv]
    try:
        result = await session.arun(
            argv,
            stdin=launch.prompt if program.task_input == "stdin" else None,
            wall_time=None if launch.timeout is None else launch.timeout + GRACE,
            env=program.variables(launch),
        )
    finally:
        server.close()
    if result.stop_reason == "timeout":
        raise TimeoutError(f"{program.describe()} ran past the sandbox's time limit")
    if result.stop_reason != "ok":
        raise ProgramError("crash", f"{program.describe()}: {result.describe()}")
    if result.exit_code != 0:
        tail = result.stderr[-STDERR_TAIL:].strip()
        raise ProgramError(
            "exit", f"{program.describe()} exited with status {result.exit_code}: {tail}"
        )
    return ProgramResult(result.stdout.strip(), result.exit_code)


async def _pipe(port: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Join a connection accepted in the session to a new one to the endpoint's ``port``."""
    try:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        writer.close()
        return
    try:
        await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))
    finally:
        for end in (writer, up_writer):
            end.close()


async def _copy(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Bytes from ``source`` to ``sink`` until the end; then end ``sink``'s writing half."""
    with contextlib.suppress(ConnectionError, OSError):
        while data := await source.read(_CHUNK):
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()
