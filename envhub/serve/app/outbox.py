"""Replies on their way out of one WebSocket connection."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from envhub._async import FirstInIteration
from envhub.serve import protocol as p

BATCH_BYTES = 1024 * 1024
"""Replies are gathered into one frame up to about this size."""
CHUNK = 64
"""Replies that finish together leave in frames of at most about this many, each as soon as it
is full: the client starts on the first while the rest are made."""


class Outbox:
    """Replies on their way out of one WebSocket connection.

    The first reply of a loop iteration is sent at once, by the task that made it (one
    session: nothing between the env's answer and the socket). Replies made later in the same
    iteration (many sessions answering together) are queued for a writer task, which sends
    what has gathered since it last woke, without a wait; once :data:`CHUNK` have gathered, the
    task that queued the last sends them at once. To a client that takes batches they go as
    JSON arrays (up to :data:`BATCH_BYTES` each): one frame and one write for many sessions'
    replies. ``busy`` tells whether the connection runs other requests: while it does not, a
    reply goes at once without marking its iteration.
    """

    def __init__(
        self,
        websocket: WebSocket,
        batches: bool,
        busy: Callable[[], bool] = lambda: True,
        line: Any = None,
    ) -> None:
        self.websocket, self.batches, self.busy = websocket, batches, busy
        self.line = line
        """The protocol's direct line (:mod:`envhub.serve.timeouts`), if the server has one:
        a frame written at once, without the ASGI send's coroutines."""
        self.replies: list[str] = []
        self.ready = asyncio.Event()
        self.writer = asyncio.ensure_future(self._write())
        self._first = FirstInIteration()
        self._closed = False

    async def send(self, reply: dict) -> None:
        """Send ``reply`` now if it is the first of this loop iteration, else queue it (and send
        the queue if it reached :data:`CHUNK`); never raises (a connection that is gone drops
        it)."""
        # A reply whose connection runs nothing else is alone in its iteration (no need to
        # mark the iteration: that costs the loop another turn).
        if self.replies or self._closed or (self.busy() and not self._first.take()):
            self.put(reply)
            if len(self.replies) >= CHUNK:  # the client can start on these while we go on
                await self._flush()
            return
        await self._send(p.dumps(reply))

    async def _send(self, frame: str) -> None:
        """Send one frame; never raises (a connection that is gone drops it)."""
        if self.line is not None and self.line.send_now(frame):
            return
        try:
            await self.websocket.send_text(frame)
        except (WebSocketDisconnect, RuntimeError, OSError):
            pass  # the client went away; its sessions are closed by the caller

    def put(self, reply: dict) -> None:
        """Queue ``reply`` for the writer."""
        if self._closed:
            return
        self.replies.append(p.dumps(reply))
        self.ready.set()

    def close(self) -> None:
        """Stop sending (the connection is gone); queued replies are dropped."""
        self._closed = True
        self.writer.cancel()

    async def _write(self) -> None:
        while True:
            await self.ready.wait()
            await self._flush()

    async def _flush(self) -> None:
        """Send what is queued."""
        self.ready.clear()
        replies, self.replies = self.replies, []
        for frame in p.batches(replies, BATCH_BYTES) if self.batches else replies:
            await self._send(frame)
