"""``WS /ENV``: a connection carries any number of sessions; requests are multiplexed by id and
answered as they finish. Sessions opened on a connection close with it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from starlette.websockets import WebSocket

from envhub.serve.app.fairness import (
    FAIR_SHARE,
    PACE,
    PACED_CHARS,
    READ_RATE,
    TURNS,
    Connection,
    Floor,
)
from envhub.serve.app.guards import Guard, json_response, larger, too_large
from envhub.serve.app.outbox import Outbox
from envhub.serve.bounds import UnreadableFrame
from envhub.serve.service import OFF_LOOP_BYTES, Caller, EnvService

BATCH_HEADER = "envhub-batch"
"""The handshake header by which a client asks for batches, and the server says it takes them."""
DIRECT_LINE = "envhub.direct_line"
"""The ASGI scope extension by which the server's WebSocket protocol
(:class:`envhub.serve.timeouts.TimedWebSocketProtocol`) offers the app frames where their bytes
arrive, and writes frames at once."""
DIRECT_CHARS = 64 * 1024
"""Frames up to this size may take the direct line (larger ones: the reader's checks)."""


class WebSocketHandler:
    """Reads each connection's frames and starts their requests, within the connection's places
    and turns (:mod:`envhub.serve.app.fairness`); replies leave through its
    :class:`~envhub.serve.app.outbox.Outbox`.

    Args:
        service: What answers requests.
        guard: The token and env-name checks.
        floor: Which connections contend for the loop (shared with the HTTP route).
        max_in_flight: Requests one connection may have running at once.
    """

    def __init__(self, service: EnvService, guard: Guard, floor: Floor, max_in_flight: int) -> None:
        self.service, self.guard, self.floor = service, guard, floor
        self.max_in_flight = max_in_flight
        self.connections: set[Connection] = set()

    async def handle(self, websocket: WebSocket) -> None:
        """Read frames, answer each as it finishes; close the connection's sessions at the end."""
        refused = self.guard.refusal(
            websocket.headers.get("authorization"), websocket.path_params["env"]
        )
        if refused is not None:
            body = self.service.refuse(refused)
            await websocket.send_denial_response(json_response(body, refused.code))
            return
        limit = self.service.limits.max_message_bytes
        batches = websocket.headers.get(BATCH_HEADER) == "1"
        headers = [(BATCH_HEADER.encode(), str(limit).encode())] if batches else None
        await websocket.accept(headers=headers)
        caller = Caller(owner=websocket, batches=batches)
        connection = Connection(websocket, self.max_in_flight, self.floor)
        self.connections.add(connection)
        self.service.metrics.connections_open += 1
        try:
            await self._read_frames(connection, caller)
        except asyncio.CancelledError:
            if connection.hung_up is None:
                raise
            with contextlib.suppress(Exception):  # it may be gone already
                await websocket.close(1001, connection.hung_up)
        finally:
            self.connections.discard(connection)
            self.service.metrics.connections_open -= 1
            await self.service.disconnected(caller)

    async def _read_frames(self, connection: Connection, caller: Caller) -> None:
        websocket = connection.websocket
        line = websocket.scope.get("extensions", {}).get(DIRECT_LINE)
        outbox = Outbox(websocket, caller.batches, connection.busy, line)
        caller.send = outbox.send
        caller.busy = connection.busy
        caller.turn = connection.turn
        if line is not None:
            line.direct = lambda text: self._direct(connection, caller, outbox, text)
        try:
            while True:
                connection.reading = True
                message = await websocket.receive()
                connection.reading = False
                if message["type"] == "websocket.disconnect":
                    return
                connection.heard()
                frame = message.get("text")
                frame = frame if frame is not None else message["bytes"]
                off_loop = len(frame) > OFF_LOOP_BYTES  # parsed and decoded in a thread
                requests = await self._read(frame, off_loop, connection, caller, outbox)
                connection.batch = len(requests) > 1
                for n, request in enumerate(requests, 1):
                    await connection.place()  # a batch's requests count one by one
                    prepared = request if off_loop else self.service.prepare(request)
                    connection.started(self.service.launch(prepared, caller), outbox)
                    if n % TURNS == 0 and (n % FAIR_SHARE == 0 or connection.contended()):
                        await asyncio.sleep(0)  # the other connections' turn
        finally:
            if line is not None:
                line.direct = None
            outbox.close()

    async def _read(
        self,
        frame: str | bytes,
        off_loop: bool,
        connection: Connection,
        caller: Caller,
        outbox: Outbox,
    ) -> list[Any]:
        """The requests of a frame: prepared (parsed and decoded in a thread) when ``off_loop``,
        else as parsed JSON, each checked as it starts; none when the frame is refused (its
        error reply queued). After a large frame, while connections contend, its connection
        waits :data:`~envhub.serve.app.fairness.PACE` times what reading the frame cost
        (parsing it here, and the protocol's reading of its bytes, estimated), before its next
        frame is read."""
        started = time.perf_counter()
        limit = self.service.limits.max_message_bytes
        requests: list[Any] = []
        if larger(frame, limit):
            outbox.put(self.service.refuse(too_large(limit)))
        else:
            try:
                if off_loop:
                    prepare_frame = self.service.prepare_frame
                    requests = await asyncio.to_thread(prepare_frame, frame, caller)
                else:
                    requests = self.service.payloads(frame, caller)
            except UnreadableFrame as e:
                outbox.put(self.service.refuse(e, e.request_id))
        if len(frame) > PACED_CHARS and connection.contended():
            cost = time.perf_counter() - started + len(frame) / READ_RATE
            await asyncio.sleep(PACE * cost)
        return requests

    def _direct(self, connection: Connection, caller: Caller, outbox: Outbox, text: str) -> bool:
        """A frame handed over by the protocol where its bytes arrived: started now when it is
        one small request and the reader waits, with nothing of the connection running (one
        session's next step: no queue and no reader task between the socket and the env, one
        loop iteration less). ``False``: the reader reads it, as any other frame."""
        if (
            not connection.reading
            or connection.in_flight
            or connection.batch
            or text[:1] != "{"  # (a batch is an array)
            or len(text) > DIRECT_CHARS
            or larger(text, self.service.limits.max_message_bytes)
        ):
            return False
        connection.heard()
        try:
            [payload] = self.service.payloads(text, caller)
        except UnreadableFrame as e:
            outbox.put(self.service.refuse(e, e.request_id))
            return True
        connection.free -= 1  # (nothing runs: there is room)
        connection.started(self.service.launch(self.service.prepare(payload), caller), outbox)
        return True
