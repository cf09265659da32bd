"""The host's side of a local session's init protocol (:mod:`envhub.sandbox.session_init`):
send a call with its three descriptors, watch the init's replies for its exit, end it."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Mapping
from typing import Any

from envhub.errors import SandboxError
from envhub.sandbox.base import Limits
from envhub.sandbox.session_init import kill_message, parse_reply, run_message

KILL_WAIT = 5.0
"""Seconds the init has to report a killed call's exit."""


def send_run(
    control: socket.socket,
    call: int,
    argv: list[str],
    env: Mapping[str, str],
    limits: Limits,
    has_stdin: bool,
) -> tuple[int | None, int, int]:
    """Ask the init to run ``argv``; the host's ends of its stdin (``None`` without
    ``has_stdin``: it reads ``/dev/null``), stdout and stderr.

    Raises:
        ValueError: No program could be given ``argv`` and ``env`` (see
            :func:`~envhub.sandbox.session_init.run_message`).
        SandboxError: The init has gone.
    """
    message = run_message(call, argv, env, limits)
    # No input: /dev/null (a pipe, its writer and its close cost more than the command often)
    stdin_r, stdin_w = os.pipe() if has_stdin else (os.open(os.devnull, os.O_RDONLY), None)
    stdout_r, stdout_w = os.pipe()
    stderr_r, stderr_w = os.pipe()
    try:
        socket.send_fds(control, [message], [stdin_r, stdout_w, stderr_w])
    except OSError as e:
        for fd in (stdin_w, stdout_r, stderr_r):
            if fd is not None:
                os.close(fd)
        raise SandboxError(f"the session's sandbox is gone ({e})") from e
    finally:
        for fd in (stdin_r, stdout_w, stderr_w):
            os.close(fd)
    return stdin_w, stdout_r, stderr_r


class ExitWatch:
    """Watches the init's replies for one call: :attr:`exited` is its exit status, and
    :attr:`first` whichever comes first of that and what :meth:`settle` is given (the
    deadline, the output cap)."""

    def __init__(self, control: socket.socket, call: int) -> None:
        self.loop = asyncio.get_running_loop()
        self.control, self.call = control, call
        self.exited: asyncio.Future[int] = self.loop.create_future()
        self.first: asyncio.Future[int | str] = self.loop.create_future()
        self.loop.add_reader(control.fileno(), self._readable)

    def settle(self, value: int | str | BaseException) -> None:
        """Settle :attr:`first` with ``value`` (an exception is raised), unless it is."""
        settle(self.first, value)

    def close(self) -> None:
        """Stop watching the socket."""
        if self.control.fileno() >= 0:
            self.loop.remove_reader(self.control.fileno())

    def _readable(self) -> None:
        try:
            data = self.control.recv(256)
        except BlockingIOError:
            return
        except OSError as e:
            self._fail(SandboxError(f"the session's sandbox is gone ({e})"))
            return
        if not data:
            self._fail(SandboxError("the session's sandbox ended (its init exited)"))
            return
        try:
            kind, which, status = parse_reply(data)
        except ValueError as e:
            self._fail(SandboxError(str(e)))
            return
        if kind == "exit" and which == self.call:
            settle(self.exited, status)
            self.settle(status)

    def _fail(self, error: SandboxError) -> None:
        self.close()  # the socket stays readable (EOF) for ever
        settle(self.exited, error)
        self.settle(error)
        self.exited.exception()  # raised through `first`; awaited or not, it is seen


def settle(future: asyncio.Future[Any], value: object) -> None:
    """Give ``future`` its result (or exception, when ``value`` is one), unless it has one."""
    if future.done():
        return
    if isinstance(value, BaseException):
        future.set_exception(value)
    else:
        future.set_result(value)


async def end_call(control: socket.socket, call: int, watch: ExitWatch) -> bool:
    """Kill a call and wait for the init to report its exit; whether it did."""
    try:
        control.send(kill_message(call))
        await asyncio.wait_for(asyncio.shield(watch.exited), KILL_WAIT)
        return True
    except BaseException:
        return False


async def receive(control: socket.socket) -> bytes:
    """The init's next reply (waiting on the loop); an error when the init has gone."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            data = control.recv(256)
        except BlockingIOError:
            data = None
        except OSError as e:
            raise SandboxError(f"the session's sandbox is gone ({e})") from e
        if data == b"":
            raise SandboxError("the session's sandbox ended (its init exited)")
        if data is not None:
            return data
        readable = loop.create_future()
        loop.add_reader(control.fileno(), _resolve, readable)
        try:
            await readable
        finally:
            loop.remove_reader(control.fileno())


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
