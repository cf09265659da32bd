"""A session call's three pipes on an event loop: feed stdin, collect stdout and stderr up to a
cap, and drain what is left once the command has exited (processes it left running may hold
the write ends open for ever: the call does not wait for them)."""

from __future__ import annotations

import asyncio
import contextlib
import os

_CHUNK = 1 << 16


class CallPipes:
    """The host's ends of one call's pipes (all non-blocking, all closed by :meth:`close`):
    ``stdin`` (if any) written then closed, ``stdout`` and ``stderr`` read into buffers of at most
    ``cap`` bytes; :attr:`over` is set when either had more."""

    def __init__(self, stdin_fd: int | None, stdout_fd: int, stderr_fd: int, cap: int) -> None:
        self.loop = asyncio.get_running_loop()
        self.cap = cap
        self.stdout, self.stderr = bytearray(), bytearray()
        self.over: asyncio.Future[None] = self.loop.create_future()
        self._fds = {stdout_fd: "r", stderr_fd: "r"}
        if stdin_fd is not None:
            self._fds[stdin_fd] = "w"
        self._buffers = {stdout_fd: self.stdout, stderr_fd: self.stderr}
        self._watched: set[int] = set()
        for fd in self._fds:
            os.set_blocking(fd, False)
        self._stdin_fd = stdin_fd

    def start(self, stdin: bytes) -> None:
        """Begin feeding ``stdin`` (when there is a pipe for it) and reading the output
        (callbacks on the loop)."""
        for fd in self._buffers:
            self._watch(fd, "r", lambda fd=fd: self._read(fd))
        if self._stdin_fd is not None:
            self._feed(memoryview(stdin))

    def drain(self) -> None:
        """Read what the output pipes hold now (the command has exited: what it wrote is in
        them), then close every pipe."""
        for fd in list(self._buffers):
            while fd in self._fds and self._read(fd):
                pass
        self.close()

    def close(self) -> None:
        """Stop watching and close every pipe still open."""
        for fd in list(self._fds):
            self._close(fd)

    def _read(self, fd: int) -> bool:
        """Read one chunk of ``fd`` into its buffer; ``False`` when there was nothing now."""
        try:
            chunk = os.read(fd, _CHUNK)
        except BlockingIOError:
            return False
        except OSError:
            chunk = b""
        if not chunk:
            self._close(fd)
            return False
        into = self._buffers[fd]
        room = self.cap - len(into)
        into.extend(chunk[: max(room, 0)])
        if len(chunk) > room and not self.over.done():
            self.over.set_result(None)
        return True

    def _feed(self, view: memoryview) -> None:
        """Write what of ``stdin`` fits now, watching for room for the rest; close at the end
        (or when the reader has gone)."""
        fd = self._stdin_fd
        try:
            while view:
                view = view[os.write(fd, view) :]
        except BlockingIOError:
            self._unwatch(fd)
            self._watch(fd, "w", lambda: self._feed(view))
            return
        except OSError:  # the command closed its stdin, or exited
            pass
        self._close(fd)

    def _watch(self, fd: int, kind: str, callback: object) -> None:
        if kind == "r":
            self.loop.add_reader(fd, callback)  # type: ignore[arg-type]
        else:
            self.loop.add_writer(fd, callback)  # type: ignore[arg-type]
        self._watched.add(fd)

    def _unwatch(self, fd: int) -> None:
        if fd in self._watched:
            self._watched.discard(fd)
            if self._fds.get(fd) == "r":
                self.loop.remove_reader(fd)
            else:
                self.loop.remove_writer(fd)

    def _close(self, fd: int) -> None:
        if fd in self._fds:
            self._unwatch(fd)
            del self._fds[fd]
            with contextlib.suppress(OSError):
                os.close(fd)
