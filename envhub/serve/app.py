"""The Starlette app of ``envhub serve``: a thin transport over :class:`EnvService`.

Routes:

- ``WS /ENV`` — a WebSocket connection carries any number of sessions; requests are
  multiplexed by id and answered as they finish. Sessions opened on a connection close with it.
- ``POST /ENV`` — one request per HTTP call; the reply's status is its error code (200 if ok).
- ``GET /healthz`` — ``{"status": "ok", "env": ...}``; ``GET /metrics`` — Prometheus text.

Replies go out as requests finish: the first of a loop iteration is sent at once by the task
that made it; those finishing with it are gathered and leave in one write. A client
that sends the ``envhub-batch: 1`` header in its handshake gets the header back with the
largest frame the server reads; it may then send a JSON array of requests in a frame (up to that
size), and gets the replies in arrays too (one frame, one write, for many sessions' replies).

``ENV`` is the name the server was started with, or the env's own name; ``/`` alone also works.
With a token, ``WS``/``POST`` need ``Authorization: Bearer TOKEN`` (401 otherwise);
``/healthz`` and ``/metrics`` carry no env data and need none. A frame over the size limit gets
a 413 error (a reply frame on WebSocket, whose connection stays open).

Against hostile clients: a frame that does not parse, or a request that is malformed or whose
value breaks a bound (:mod:`envhub.serve.bounds`), gets an error reply on its own id while the
connection's other sessions go on (over HTTP, a JSON body with the error's status, never a
plain-text 500); frames over 512 KB are read in a worker thread. A connection runs at most
``max_in_flight`` requests at once, each of a batch counted (reading waits for room: one
client's batches back-pressure it, not the others); a batch's requests are started
:data:`FAIR_SHARE` at a time, the other connections served in between. While several
connections send frames, each one's requests run at most :data:`TURNS` to a loop iteration
(:class:`Floor`, :meth:`Connection.turn`): a client's request waits for iterations of bounded
length, whatever another client's batches hold. A request that runs alone on its connection
starts eagerly (answered in the loop iteration that read it); served by
:func:`envhub.serve.server.uvicorn_config`, such a request is started where its frame's bytes
arrive (the protocol's direct line: :data:`DIRECT_LINE`) and its reply written at once. A
connection with no frame and nothing running for ``idle_timeout`` seconds is closed (1001);
half-sent frames and requests are :mod:`envhub.serve.timeouts`' to cut.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hmac
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from envhub._async import FirstInIteration
from envhub.serve import protocol as p
from envhub.serve.bounds import UnreadableFrame
from envhub.serve.service import OFF_LOOP_BYTES, Answer, Caller, EnvService

logger = logging.getLogger(__name__)

MAX_IN_FLIGHT = 1024
"""Requests one WebSocket connection may have running at once (a batch's requests count one by
one); reading waits beyond it (back-pressure, not an error)."""
FAIR_SHARE = 128
"""A batch's requests are started this many at a time, the loop serving other connections in
between: one client's big batch does not hold up the others."""
TURNS = 32
"""While other connections are active, one connection's requests run at most about this many
at a time in one loop iteration (the others wait for the next): another client's request waits
for an iteration of bounded length, not for hundreds of a batch's steps."""
CONTENDED_FOR = 1.0
"""Seconds after frames last came from two connections in turn during which they contend for
the loop (and :data:`TURNS` and :data:`PACE` apply; see :class:`Floor`)."""
PACE = 4.0
"""While connections contend, a connection that sent a frame over :data:`PACED_CHARS` waits this
many times what reading it cost before its next frame is read (an HTTP reply to a big body is
delayed alike): big frames (a client's, or an attacker's, that cost the loop milliseconds each)
take at most a fifth of the loop's time."""
PACED_CHARS = 64 * 1024
READ_RATE = 200e6
"""Bytes per second that uvicorn's protocol reads a frame at (unmasking, UTF-8 checks and
decoding, before the app has it): an estimate, for :data:`PACE`."""
PARSE_RATE = 50e6
"""Bytes per second that an HTTP body is parsed at: an estimate, for :data:`PACE` (an HTTP
request's time also holds its env call's, which is not the loop's)."""
BATCH_HEADER = "envhub-batch"
"""The handshake header by which a client asks for batches, and the server says it takes them."""
BATCH_BYTES = 1024 * 1024
"""Replies are gathered into one frame up to about this size."""
DIRECT_LINE = "envhub.direct_line"
"""The ASGI scope extension by which the server's WebSocket protocol
(:class:`envhub.serve.timeouts.TimedWebSocketProtocol`) offers the app frames where their bytes
arrive, and writes frames at once."""
DIRECT_CHARS = 64 * 1024
"""Frames up to this size may take the direct line (larger ones: the reader's checks)."""
CHUNK = 64
"""Replies that finish together leave in frames of at most about this many, each as soon as it
is full: the client starts on the first while the rest are made."""


class ServeApp:
    """Routes and lifecycle around one :class:`EnvService`.

    Args:
        service: What answers requests.
        env_names: Names the env may be addressed by in the URL path.
        token: The bearer token clients must send (``None``: no auth).
        sweep_every: Seconds between passes that close expired sessions and idle connections.
        threads: Worker threads for sync envs (the loop's default executor).
        idle_timeout: Seconds a WebSocket connection may stay idle (no frame from the client and
            no request running: an env step, however long, is not idle time) before the server
            closes it (1001).
        max_in_flight: Requests one WebSocket connection may have running at once.
    """

    def __init__(
        self,
        service: EnvService,
        env_names: set[str],
        token: str | None,
        sweep_every: float,
        threads: int,
        idle_timeout: float = 600.0,
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        self.service, self.env_names, self.token = service, env_names, token
        self.sweep_every, self.threads = sweep_every, threads
        self.idle_timeout, self.max_in_flight = idle_timeout, max_in_flight
        self.http_caller = Caller(owner=None)
        self.http_spoke_at = -math.inf
        """When the last HTTP request came (HTTP clients contend for the loop as one)."""
        self.connections: set[Connection] = set()
        self.floor = Floor()

    def starlette(self) -> Starlette:
        """The ASGI app."""
        return Starlette(
            routes=[
                Route("/healthz", self.healthz),
                Route("/metrics", self.metrics),
                Route("/{env:path}", self.http_call, methods=["POST"]),
                WebSocketRoute("/{env:path}", self.websocket),
            ],
            lifespan=self.lifespan,
        )

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        """Start the expiry sweeper; on shutdown, close every session."""
        executor = ThreadPoolExecutor(self.threads, thread_name_prefix="envhub-serve")
        asyncio.get_running_loop().set_default_executor(executor)
        sweeper = asyncio.ensure_future(self._sweep())
        try:
            yield
        finally:
            sweeper.cancel()
            await self.service.shutdown()

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_every)
            self._close_idle()
            await self.service.expire()

    def _close_idle(self) -> None:
        now = asyncio.get_running_loop().time()
        for connection in list(self.connections):
            if connection.idle_since(now) > self.idle_timeout:
                connection.hang_up(f"idle for more than {self.idle_timeout:g} s")

    # -- plain endpoints ------------------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        """Liveness: the server runs and which env it serves."""
        return JSONResponse({"status": "ok", "env": sorted(self.env_names)[0]})

    async def metrics(self, request: Request) -> Response:
        """Counters and gauges in the Prometheus text format."""
        m = self.service.metrics
        values = {
            "sessions_open": len(self.service.store),
            "connections_open": m.connections_open,
            "sessions_created_total": m.sessions_created,
            "sessions_expired_total": m.sessions_expired,
            "requests_total": m.requests,
            "errors_total": m.errors,
            "steps_total": m.steps,
            "resets_total": m.resets,
            "replays_total": m.replays,
        }
        lines = [f"envhub_serve_{name} {value}" for name, value in values.items()]
        return PlainTextResponse("\n".join(lines) + "\n")

    # -- HTTP -----------------------------------------------------------------------------------

    async def http_call(self, request: Request) -> Response:
        """One request in the body, its reply in the response."""
        refused = self._refusal(request.headers.get("authorization"), request.path_params["env"])
        if refused is not None:
            return _json(self.service.refuse(refused), refused.code)
        try:
            body = await _read_bounded(request, self.service.limits.max_message_bytes)
        except ClientDisconnect:  # it went away (or was cut off half-sent): nobody to answer
            return Response(status_code=400)
        if body is None:
            limit = self.service.limits.max_message_bytes
            return _json(self.service.refuse(_too_large(limit)), 413)
        now = asyncio.get_running_loop().time()
        self.floor.heard(self.http_caller, now, self.http_spoke_at)  # every HTTP client as one
        self.http_spoke_at = now
        reply = await self.service.handle(body, self.http_caller)
        if len(body) > PACED_CHARS and self.floor.contended(now):  # as a connection's frames
            await asyncio.sleep(PACE * len(body) / PARSE_RATE)
        return _json(reply, 200 if reply["ok"] else reply["error"]["code"])

    def _refusal(self, authorization: str | None, env: str) -> p.RequestError | None:
        if self.token is not None and not _token_matches(authorization, self.token):
            return p.RequestError(
                401,
                p.UNAUTHORIZED,
                "missing or wrong bearer token; send `Authorization: Bearer TOKEN` (RemoteEnv: "
                "set ENVHUB_SERVE_TOKEN or pass token=)",
            )
        if env and env not in self.env_names:
            return p.RequestError(
                404, p.WRONG_ENV, f"this server serves {sorted(self.env_names)[0]!r}, not {env!r}"
            )
        return None

    # -- WebSocket ------------------------------------------------------------------------------

    async def websocket(self, websocket: WebSocket) -> None:
        """Read frames, answer each as it finishes; close the connection's sessions at the end."""
        refused = self._refusal(
            websocket.headers.get("authorization"), websocket.path_params["env"]
        )
        if refused is not None:
            body = self.service.refuse(refused)
            await websocket.send_denial_response(_json(body, refused.code))
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
        waits :data:`PACE` times what reading the frame cost (parsing it here, and the
        protocol's reading of its bytes, estimated), before its next frame is read."""
        started = time.perf_counter()
        limit = self.service.limits.max_message_bytes
        requests: list[Any] = []
        if _larger(frame, limit):
            outbox.put(self.service.refuse(_too_large(limit)))
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
            or _larger(text, self.service.limits.max_message_bytes)
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


class Floor:
    """Which connection spoke last, and when two last spoke in turn: whether connections
    contend for the loop (one client alone runs its batches at full speed).

    Two connections contend when frames come from one, then from the other, each having spoken
    within :data:`CONTENDED_FOR` s: a client whose sessions were opened over one connection
    and then run over another (as ``RemoteEnv``'s are) does not contend with itself."""

    def __init__(self) -> None:
        self.last: object | None = None
        """The connection that spoke last (every HTTP client counts as one, its caller)."""
        self.last_at = -math.inf
        """When :attr:`last` last spoke."""
        self.shared_at = -math.inf

    def heard(self, connection: object, now: float, before: float) -> None:
        """A frame came from ``connection`` at ``now`` (its previous one at ``before``)."""
        if connection is not self.last:
            if now - before < CONTENDED_FOR and now - self.last_at < CONTENDED_FOR:
                self.shared_at = now
            self.last = connection
        self.last_at = now

    def contended(self, now: float) -> bool:
        """Whether two connections sent frames in turn within :data:`CONTENDED_FOR` s."""
        return now - self.shared_at < CONTENDED_FOR


class Connection:
    """One WebSocket connection's in-flight requests and clock.

    Its requests (each of a batch) take a place (:meth:`place`) until answered; reading waits
    while none is free. It is idle while no request runs and no frame comes. While connections
    contend (:class:`Floor`), its requests take turns (:meth:`turn`): about :data:`TURNS` run
    in one loop iteration, the others in the next ones.
    """

    def __init__(self, websocket: WebSocket, max_in_flight: int, floor: Floor) -> None:
        self.websocket, self.floor = websocket, floor
        self.free = max_in_flight
        """Places left for requests (a batch's count one by one)."""
        self._room: asyncio.Future[None] | None = None
        self.in_flight = 0
        self.batch = False
        """The frame being read holds several requests."""
        self.reading = False
        """The reader waits for the next frame."""
        self.loop = asyncio.get_running_loop()
        self.last_heard = self.loop.time()
        """When a frame came or an answer left (idle since)."""
        self.spoke_at = -math.inf
        """When the last frame came."""
        self.reader = asyncio.current_task()
        self.hung_up: str | None = None
        """Why the server hangs up (set when it does)."""
        self.turns_left = TURNS
        self.waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._counting = False
        """A new iteration's turns are due (its callback is scheduled)."""

    def heard(self) -> None:
        """A frame came."""
        self.last_heard = now = self.loop.time()
        self.floor.heard(self, now, self.spoke_at)
        self.spoke_at = now

    def contended(self) -> bool:
        """Whether other connections contend for the loop (:class:`Floor`)."""
        return self.floor.contended(self.last_heard)

    def turn(self) -> asyncio.Future[None] | None:
        """A request of this connection is about to run on the loop: ``None`` if it may now,
        else a future to await first (done at a later iteration, when its turn comes)."""
        if not self.waiting and (self.turns_left > 0 or not self.contended()):
            self.turns_left -= 1
            self._count()
            return None
        waiting = self.loop.create_future()
        self.waiting.append(waiting)
        self._count()
        return waiting

    def _count(self) -> None:
        if not self._counting:
            self._counting = True
            self.loop.call_soon(self._next_iteration)

    def _next_iteration(self) -> None:
        """A new loop iteration: new turns, given first to the requests that wait."""
        self._counting = False
        self.turns_left = TURNS
        while self.waiting and self.turns_left > 0:
            waiting = self.waiting.popleft()
            if not waiting.done():  # (cancelled: the server is shutting down)
                waiting.set_result(None)
                self.turns_left -= 1
        if self.waiting:
            self._count()

    async def place(self) -> None:
        """Take a place for a request, waiting while none is free (back-pressure)."""
        while self.free <= 0:
            self._room = self.loop.create_future()
            await self._room
        self.free -= 1

    def _release(self) -> None:
        self.free += 1
        if self._room is not None and not self._room.done():
            self._room.set_result(None)

    def started(self, answer: Answer, outbox: Outbox) -> None:
        """A request was started: its reply now, or the future of it (which holds its place)."""
        if isinstance(answer, dict):
            self._release()
            outbox.put(answer)
            return
        if answer.done():  # answered as it started (a natively async env's step): sent already
            self.last_heard = self.loop.time()
            self._release()
            return
        # Its task sends the reply; the env call goes on if the client goes (a retry finds it).
        self.in_flight += 1
        answer.add_done_callback(self._finished)

    def _finished(self, answer: asyncio.Future[dict]) -> None:
        self.in_flight -= 1
        self.last_heard = self.loop.time()  # idle from the last answer on
        self._release()

    def busy(self) -> bool:
        """Whether a request of it is running, or more come in the frame being read."""
        return self.in_flight > 0 or self.batch

    def idle_since(self, now: float) -> float:
        """Seconds it has been idle (0 while a request runs)."""
        return 0.0 if self.in_flight else now - self.last_heard

    def hang_up(self, why: str) -> None:
        """Stop reading (the handler closes the connection, saying ``why``)."""
        if self.hung_up is None and self.reader is not None:
            self.hung_up = why
            self.reader.cancel()


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


def _token_matches(authorization: str | None, token: str) -> bool:
    scheme, _, given = (authorization or "").partition(" ")
    # Constant time, so the reply's timing does not tell how much of a guess was right.
    return scheme.lower() == "bearer" and hmac.compare_digest(given.encode(), token.encode())


def _larger(frame: str | bytes, limit: int) -> bool:
    """Whether ``frame`` is larger than ``limit`` bytes (a short text is not encoded to tell)."""
    if isinstance(frame, bytes) or len(frame) > limit:  # (a character takes a byte or more)
        return len(frame) > limit
    return len(frame) > limit // 4 and len(frame.encode()) > limit


def _too_large(limit: int) -> p.RequestError:
    return p.RequestError(
        413,
        p.TOO_LARGE,
        f"the frame is larger than this server's limit of {limit} bytes "
        "(envhub serve --max-message-bytes)",
    )


async def _read_bounded(request: Request, limit: int) -> bytes | None:
    """The body, or ``None`` as soon as it is larger than ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _json(payload: dict, status: int) -> Response:
    # JSONResponse refuses inf/nan, which rewards and reward ranges may hold.
    return Response(p.dumps(payload), status, media_type="application/json")
