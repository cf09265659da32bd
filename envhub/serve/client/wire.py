"""The bytes of one open WebSocket connection, under :class:`Wire`."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from envhub.serve.client.errors import ConnectionLost
from envhub.serve.client.framing import BINARY, REST, TEXT, Frames


class Owner(Protocol):
    """What a :class:`Wire` tells its transport."""

    def received(self, text: str | bytes, wire: Wire) -> None:
        """A whole message came over ``wire``."""

    def dropped(self, wire: Wire, error: BaseException | None) -> None:
        """``wire``'s connection is gone (``error``: why)."""

    def closing(self, wire: Wire) -> None:
        """``wire``'s connection is closing: the next request opens a new one."""

    def lost(self, error: BaseException | None) -> str:
        """The message of the error that a lost connection's requests fail with."""


class Wire(asyncio.Protocol):
    """The bytes of one open WebSocket connection, driven by websockets' sans-I/O protocol.

    websockets' client opens the connection; then this protocol takes the socket over
    (``transport.set_protocol``): a frame is parsed where its bytes arrive and its replies are
    handed to the waiting requests there, and a request's frame is written at once, with no
    reader task, message queue or send lock between (about a third of the client's time per
    request at one session went to those, and one loop iteration).

    The frames of every request and reply (whole text or binary messages, masked when sent as
    RFC 6455 asks) are read and written here (:class:`~envhub.serve.client.framing.Frames`);
    websockets' protocol reads every other frame (pings, a closing handshake, fragments), each
    given to it whole, and keeps the connection's state (once it saw a fragment or an oversized
    frame, it reads all that follows)."""

    def __init__(self, owner: Owner, connection: Any, generation: int) -> None:
        from websockets.frames import Opcode
        from websockets.protocol import State

        self.owner, self.generation = owner, generation
        self.connection = connection  # kept: its protocol's logger refers to it weakly
        self.protocol, self.transport = connection.protocol, connection.transport
        self._open = State.OPEN
        self._data_opcodes = (Opcode.TEXT, Opcode.BINARY)
        self._continuation = Opcode.CONT
        self._parts: list[bytes] = []
        self.paused = False
        self._resumed: asyncio.Future[None] | None = None
        self._gone = asyncio.get_running_loop().create_future()
        self._frames: Frames | None = Frames()
        """Our own reading of frames; ``None`` once websockets' protocol reads everything."""
        self.transport.set_protocol(self)
        self._take_events()  # anything that came with the handshake
        reader = getattr(self.protocol, "reader", None)  # websockets' parser buffer (13+)
        if getattr(reader, "buffer", True):  # a frame began with it: websockets goes on reading
            self._frames = None

    # -- asyncio.Protocol ------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:  # noqa: D102 (asyncio's hook)
        frames = self._frames
        if frames is None:
            self.protocol.receive_data(data)
            self._take_events()
            return
        for kind, payload in frames.read(data):
            if kind == TEXT:
                try:
                    text = payload.decode()
                except UnicodeDecodeError as e:  # not UTF-8: websockets closes with 1007
                    self.close_with(e)
                    return
                self.owner.received(text, self)
            elif kind == BINARY:
                self.owner.received(payload, self)
            else:  # a control frame (given whole), or the rest once websockets reads it all
                if kind == REST:
                    self._frames = None
                self.protocol.receive_data(payload)
                self._take_events()
            if self._gone.done() or self.transport.is_closing():
                return

    def eof_received(self) -> None:  # noqa: D102
        self.protocol.receive_eof()
        self._take_events()

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: D102
        if not self._gone.done():
            self._gone.set_result(None)
        self._wake_writers()
        self.owner.dropped(self, exc or self._close_error())

    def pause_writing(self) -> None:  # noqa: D102
        self.paused = True

    def resume_writing(self) -> None:  # noqa: D102
        self.paused = False
        self._wake_writers()

    # -- the transport's side ----------------------------------------------------------------

    def send(self, frame: str) -> None:
        """Write a text frame now.

        Raises:
            ConnectionLost: The connection is closing or gone.
        """
        if self._gone.done() or self.transport.is_closing():
            self.owner.closing(self)
            raise ConnectionLost(self.owner.lost(self._close_error()))
        if self._frames is not None and self.protocol.state is self._open:
            self.transport.write(self._frames.text(frame.encode()))
            return
        try:
            self.protocol.send_text(frame.encode())
        except Exception as e:  # websockets' InvalidState: a close is under way
            raise ConnectionLost(self.owner.lost(e)) from e
        self._flush()

    async def drained(self) -> None:
        """Wait until the socket takes more (the server reads again, or the connection ends)."""
        while self.paused and not self._gone.done():
            self._resumed = asyncio.get_running_loop().create_future()
            await self._resumed

    def close_with(self, error: BaseException) -> None:
        """Drop the connection because of ``error`` (what waits on it fails with it)."""
        self.transport.abort()
        self.owner.dropped(self, error)

    async def close(self) -> None:
        """Close the connection with a closing handshake (2 s at most)."""
        if self._gone.done():
            return
        try:
            self.protocol.send_close()
            self._flush()
            await asyncio.wait_for(asyncio.shield(self._gone), 2)
        except Exception:  # no answer, or no longer open: cut it
            self.transport.abort()
        except asyncio.CancelledError:  # the loop is shutting down: no time for a handshake
            self.transport.abort()
            raise

    def _close_error(self) -> BaseException | None:
        """Why the connection closed, as websockets tells it (``None`` before it has)."""
        try:
            return self.protocol.close_exc
        except AssertionError:  # no closing handshake (yet)
            return None

    def _take_events(self) -> None:
        for event in self.protocol.events_received():
            opcode = event.opcode
            if opcode in self._data_opcodes or opcode is self._continuation:
                self._part(event, opcode)
        self._flush()  # pongs, a closing handshake's answer
        if self.protocol.close_expected() and not self.transport.is_closing():
            self.transport.close()

    def _part(self, frame: Any, opcode: Any) -> None:
        if frame.fin and not self._parts:
            self.owner.received(
                frame.data if opcode is not self._data_opcodes[0] else frame.data.decode(), self
            )
            return
        self._parts.append(frame.data)
        if frame.fin:
            data, self._parts = b"".join(self._parts), []
            self.owner.received(data, self)

    def _flush(self) -> None:
        for data in self.protocol.data_to_send():
            if data:
                self.transport.write(data)
            elif self.transport.can_write_eof():
                self.transport.write_eof()

    def _wake_writers(self) -> None:
        if self._resumed is not None and not self._resumed.done():
            self._resumed.set_result(None)
