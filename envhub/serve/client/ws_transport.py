"""The ``ws://`` transport: requests multiplexed by id over one WebSocket connection."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from envhub.errors import RemoteEnvUnavailableError
from envhub.serve import protocol as p
from envhub.serve.client.base import BATCH_HEADER, MAX_REPLY_BYTES, Transport
from envhub.serve.client.deadlines import TIMED_OUT, Deadlines
from envhub.serve.client.errors import ConnectionLost, refused
from envhub.serve.client.wire import Wire

logger = logging.getLogger(__name__)


class WebSocketTransport(Transport):
    """Requests multiplexed over one WebSocket connection (reopened when it drops)."""

    def __init__(self, url: str, token: str | None, open_timeout: float | None) -> None:
        self.url, self.token, self.open_timeout = url, token, open_timeout
        self.generation = 0
        self._ws: Wire | None = None
        self._pending: dict[str, asyncio.Future[tuple[dict[str, Any], int]]] = {}
        self._connecting = asyncio.Lock()
        self._outbox: list[str] = []
        self._ready = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._batch_bytes = 0
        """The largest batch frame the server takes (0: it takes no batches)."""
        self._deadlines = Deadlines()

    def alive(self, generation: int) -> bool:
        """True while the connection that ``generation`` names is open."""
        return self._ws is not None and self.generation == generation

    async def request(
        self, frame: str, request_id: str, timeout: float | None, retries: int
    ) -> tuple[dict[str, Any], int]:
        """Send ``frame``; on a timeout, or when the connection drops, send it again (same id:
        the server answers it once), up to ``retries`` times. The last try's error is raised:
        ``cannot reach`` when no new connection opens."""
        loop = asyncio.get_running_loop()
        try:
            for attempt in range(retries + 1):
                # A fresh future per try; a late answer to an earlier try resolves the current one.
                answer = self._pending[request_id] = loop.create_future()
                try:
                    await self._send(frame)
                    if timeout:
                        self._deadlines.watch(answer, timeout, loop)
                    reply = await answer
                except ConnectionLost:
                    if attempt == retries:
                        raise
                    continue
                finally:
                    self._deadlines.forget(answer)
                if reply is not TIMED_OUT:
                    return reply
                logger.warning("%s: no answer in %g s; sending it again", self.url, timeout)
            raise RemoteEnvUnavailableError(
                f"{self.url} did not answer within {timeout:g} s ({retries + 1} tries)"
            )
        finally:
            self._pending.pop(request_id, None)

    async def _send(self, frame: str) -> None:
        """Send a frame at once when it is the only request waiting (one session: no wait);
        queue the others for the writer, which sends them together (a batch; with other
        requests in flight, one iteration's wait costs nothing, and fuller batches gave ~25%
        more steps/s at 1024 sessions)."""
        wire = self._ws if self._ws is not None else await self._connection()
        if self._outbox or len(self._pending) > 1:
            self._outbox.append(frame)
            self._ready.set()
            return
        wire.send(frame)
        if wire.paused:
            await wire.drained()

    async def _connection(self) -> Wire:
        async with self._connecting:
            if self._ws is None:
                connection = await self._connect()
                self.generation += 1
                self._batch_bytes = int(connection.response.headers.get(BATCH_HEADER) or 0)
                self._ws = wire = Wire(self, connection, self.generation)
                # What was queued for the old connection failed with it.
                self._outbox, self._ready = [], asyncio.Event()
                self._writer = asyncio.ensure_future(self._write(wire, self._outbox, self._ready))
            return self._ws

    async def _connect(self) -> Any:
        """A connection opened (handshake, TLS, proxy) by websockets' own client, without its
        keepalive pings: :class:`~envhub.serve.client.wire.Wire` takes its bytes over."""
        from websockets.asyncio.client import connect
        from websockets.exceptions import InvalidStatus, WebSocketException

        headers = {BATCH_HEADER: "1"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            return await connect(
                self.url,
                additional_headers=headers,
                max_size=MAX_REPLY_BYTES,
                open_timeout=self.open_timeout,
                ping_interval=None,
                close_timeout=2,
                compression=None,
            )
        except InvalidStatus as e:
            raise refused(self.url, e.response.status_code, e.response.body) from None
        except (OSError, asyncio.TimeoutError, TimeoutError, WebSocketException) as e:
            raise RemoteEnvUnavailableError(
                f"cannot reach {self.url} ({type(e).__name__}: {e}); is `envhub serve` running "
                "there?"
            ) from e

    async def _write(self, wire: Wire, outbox: list[str], ready: asyncio.Event) -> None:
        """Send what is queued for ``wire``, in batches when the server takes them, until the
        connection drops (what waits on it fails then)."""
        try:
            while True:
                await ready.wait()
                ready.clear()
                frames = outbox[:]
                outbox.clear()
                if self._batch_bytes:
                    frames = p.batches(frames, self._batch_bytes)
                for frame in frames:
                    wire.send(frame)
                    if wire.paused:
                        await wire.drained()
        except ConnectionLost:
            pass

    # -- what the wire tells (wire.Owner) ---------------------------------------------------------

    def received(self, text: str | bytes, wire: Wire) -> None:
        """A frame from the server: hand each reply in it to the request waiting for it."""
        try:
            replies = json.loads(text)
        except ValueError as e:  # a reply that is not JSON: the peer is no envhub server
            wire.close_with(e)
            return
        for reply in replies if isinstance(replies, list) else (replies,):
            self._deliver(reply, wire.generation)

    def _deliver(self, reply: dict[str, Any], generation: int) -> None:
        answer = self._pending.get(reply.get("id"))  # an answer to a retry may come twice
        if answer is not None and not answer.done():
            answer.set_result((reply, generation))
        elif reply.get("id") is None:
            logger.warning("%s: %s", self.url, (reply.get("error") or {}).get("message"))

    def dropped(self, wire: Wire, error: BaseException | None) -> None:
        """``wire``'s connection is gone: fail what waits on it."""
        if self._ws is wire:
            self._ws = None
            if self._writer is not None:
                self._writer.cancel()
        lost = ConnectionLost(self.lost(error))
        for answer in self._pending.values():
            if not answer.done():
                answer.set_exception(lost)

    def closing(self, wire: Wire) -> None:
        """``wire`` is closing: the next try opens a new connection."""
        if self._ws is wire:
            self._ws = None

    def lost(self, error: BaseException | None) -> str:
        """What a request lost with the connection says (``error``: why it closed)."""
        why = f"{type(error).__name__}: {error}" if error is not None else "closed"
        return (
            f"the connection to {self.url} was lost ({why}); the server closed the sessions "
            "opened on it"
        )

    async def aclose(self) -> None:
        """Close the connection (the server closes its sessions)."""
        wire, self._ws = self._ws, None
        if self._writer is not None:
            self._writer.cancel()
        if wire is not None:
            await wire.close()
