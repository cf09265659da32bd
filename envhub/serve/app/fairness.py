"""Fairness between connections: how many requests one may run, and when they take turns.

A connection's requests take places (at most :data:`MAX_IN_FLIGHT`); reading waits for room.
While connections contend for the loop (:class:`Floor`), each runs at most :data:`TURNS`
requests a loop iteration (:meth:`Connection.turn`), and one that sends big frames waits
:data:`PACE` times what reading them cost.
"""

from __future__ import annotations

import asyncio
import collections
import math

from starlette.websockets import WebSocket

from envhub.serve.app.outbox import Outbox
from envhub.serve.service import Answer

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
