"""Sessions of ``envhub serve``: one env instance each, with its recent answers and a clock.

A session is opened by ``create`` and lives until ``close``, until it has been idle for the
session TTL, until the WebSocket connection that opened it goes away (a client that vanished
mid-episode frees its env), or until the server shuts down. Requests of one session run one at a
time (an env is not thread-safe); sessions run side by side.

:class:`EnvSession` (an env and its lock) is what a session is under either protocol: the OpenEnv
server (:mod:`envhub.serve.openenv_protocol`) extends it with its own episode bookkeeping.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from envhub._async import start_eagerly
from envhub.env import Env
from envhub.serve.protocol import (
    CAPACITY,
    SEQ_WINDOW,
    SHUTTING_DOWN,
    UNKNOWN_SESSION,
    RequestError,
)

logger = logging.getLogger(__name__)

Answer = dict[str, Any]


class AnswerCache:
    """The answers to a scope's last ``size`` requests by id, including ones still running.

    A request whose id is here gets the stored answer, or waits for the running one: a client
    that timed out and retried gets the first answer. (That the env never steps twice for an
    older retry is :class:`RequestSequence`'s work.)
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._tasks: OrderedDict[str, asyncio.Future[Answer]] = OrderedDict()

    def get(self, request_id: str) -> asyncio.Future[Answer] | None:
        """The stored (or running) answer to ``request_id``, if it is still kept."""
        return self._tasks.get(request_id)

    def start(
        self, request_id: str, compute: Callable[[], Awaitable[Answer]], eager: bool = False
    ) -> asyncio.Future[Answer]:
        """The future answer to a new ``request_id``: a task running ``compute()``; with
        ``eager``, started now (a natively async env's step is answered before this returns,
        one loop iteration sooner). Whoever awaits it must shield it: a caller that goes away
        (its connection dropped) leaves the work to finish, so that a retry finds its answer."""
        work = compute()
        task = start_eagerly(work) if eager else asyncio.ensure_future(work)
        self._tasks[request_id] = task
        self._evict()
        return task

    def _evict(self) -> None:
        while len(self._tasks) > self.size:
            oldest = next(iter(self._tasks))
            if not self._tasks[oldest].done():
                break  # never forget a running request
            del self._tasks[oldest]


class RequestSequence:
    """Which request numbers (``seq``) a session has started: the highest, and a bitmap of the
    ``window`` numbers below it. Memory stays bounded however long the session lives; numbers
    older than the window count as started (a retry that late is refused, never run twice).
    """

    def __init__(self, window: int = SEQ_WINDOW) -> None:
        self.window = window
        self.highest = 0
        self._seen = 0
        """Bit ``i``: ``highest - i`` was started."""

    def take(self, seq: int) -> bool:
        """Whether ``seq`` is new; if so it is remembered as started."""
        if seq > self.highest:
            shift = seq - self.highest
            self._seen = (
                ((self._seen << shift) | 1) & ((1 << self.window) - 1) if shift < self.window else 1
            )
            self.highest = seq
            return True
        age = self.highest - seq
        if age >= self.window or self._seen >> age & 1:
            return False
        self._seen |= 1 << age
        return True


@dataclass(eq=False)
class EnvSession:
    """One env instance served to one client: what both servers' sessions hold (``envhub``'s
    :class:`Session`, and :class:`~envhub.serve.openenv_protocol.OpenEnvSession`)."""

    env: Env
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held while a request runs: an env is not thread-safe, so a session's requests run one at
    a time."""


@dataclass(kw_only=True)
class Session(EnvSession):
    """A session of the ``envhub`` protocol: its id, owner, recent answers and clock."""

    id: str
    owner: object | None
    """The WebSocket connection that opened it (``None`` over HTTP: only the TTL ends it)."""
    answers: AnswerCache
    sequence: RequestSequence = field(default_factory=RequestSequence)
    """The request numbers started, for retries older than ``answers`` keeps."""
    last_used: float = field(default_factory=time.monotonic)
    busy: int = 0
    """Requests running now; a busy session never expires."""
    shown: int = 0
    """Messages of a ``TaskEnv``'s state already sent to the client (in an ``EpisodeView``)."""


@dataclass
class Metrics:
    """Counters for ``/metrics``."""

    requests: int = 0
    errors: int = 0
    steps: int = 0
    resets: int = 0
    replays: int = 0
    """Requests answered from the answer cache (retries)."""
    sessions_created: int = 0
    sessions_expired: int = 0
    connections_open: int = 0


class SessionStore:
    """The open sessions, bounded in number, expired after ``ttl`` seconds idle.

    Args:
        max_sessions: Sessions open at once (counting ones being made); more are refused.
        ttl: Seconds a session may stay idle.
        answers_per_session: Answers kept per session for retries (older retries are refused by
            the session's :class:`RequestSequence`, not run again). A ``RemoteEnv`` has one
            request in flight per session; a few more let a client pipeline. Kept small: with
            64 each, 1024 sessions held ~0.5M objects for the garbage collector to walk, and
            ``bench/openenv_compare.py`` ran ~10% slower at 1024 sessions.
    """

    def __init__(self, max_sessions: int, ttl: float, answers_per_session: int = 8) -> None:
        self.max_sessions, self.ttl = max_sessions, ttl
        self.answers_per_session = answers_per_session
        self.metrics = Metrics()
        self._sessions: dict[str, Session] = {}
        self._reserved = 0
        self._closing = False

    def __len__(self) -> int:
        return len(self._sessions)

    def reserve(self) -> None:
        """Hold a place for a session about to be made (making an env may take a while).

        Raises:
            RequestError: The server is full (503) or shutting down.
        """
        if self._closing:
            raise RequestError(503, SHUTTING_DOWN, "the server is shutting down")
        if len(self._sessions) + self._reserved >= self.max_sessions:
            raise RequestError(
                503,
                CAPACITY,
                f"the server already holds its maximum of {self.max_sessions} sessions; close "
                "some, or restart `envhub serve` with a higher --max-sessions",
            )
        self._reserved += 1

    def open(self, env: Env, owner: object | None) -> Session:
        """Turn a reservation into a session holding ``env``."""
        self._reserved -= 1
        session = Session(
            env,
            id=f"s-{secrets.token_urlsafe(12)}",
            owner=owner,
            answers=AnswerCache(self.answers_per_session),
        )
        self._sessions[session.id] = session
        self.metrics.sessions_created += 1
        return session

    def release(self) -> None:
        """Give back a reservation whose env could not be made."""
        self._reserved -= 1

    def get(self, session_id: str) -> Session:
        """The live session ``session_id``; it counts as used now.

        Raises:
            RequestError: No such session (404): closed, expired, or its connection went away.
        """
        session = self._sessions.get(session_id)
        if session is not None and self._idle_too_long(session, time.monotonic()):
            self._forget(session, expired=True)
            session = None
        if session is None:
            raise RequestError(
                404,
                UNKNOWN_SESSION,
                f"no session {session_id!r} on this server: it was closed, its connection went "
                f"away, or it expired after {self.ttl:g} s idle; create a new session",
            )
        session.last_used = time.monotonic()
        return session

    def close(self, session_id: str) -> Session | None:
        """Forget the session (its env is closed by :func:`close_env`); ``None`` if unknown."""
        session = self._sessions.get(session_id)
        if session is not None:
            self._forget(session)
        return session

    def owned_by(self, owner: object) -> list[Session]:
        """Forget and return every session that ``owner`` opened."""
        sessions = [s for s in self._sessions.values() if s.owner is owner]
        for session in sessions:
            self._forget(session)
        return sessions

    def expired(self) -> list[Session]:
        """Forget and return every session idle for longer than the TTL."""
        now = time.monotonic()
        sessions = [s for s in self._sessions.values() if self._idle_too_long(s, now)]
        for session in sessions:
            self._forget(session, expired=True)
        return sessions

    def drain(self) -> list[Session]:
        """Refuse new sessions; forget and return every open one (shutdown)."""
        self._closing = True
        sessions = list(self._sessions.values())
        self._sessions.clear()
        return sessions

    def _idle_too_long(self, session: Session, now: float) -> bool:
        return session.busy == 0 and now - session.last_used > self.ttl

    def _forget(self, session: Session, expired: bool = False) -> None:
        if self._sessions.pop(session.id, None) is not None and expired:
            self.metrics.sessions_expired += 1
            logger.info("session %s expired after %g s idle", session.id, self.ttl)


async def close_env(session: Session, wait: float = 10.0) -> None:
    """Close the session's env once its running request (if any) is done, or after ``wait`` s.

    A ``close`` that raises is the env's bug; it is logged and the server goes on.
    """
    try:
        await asyncio.wait_for(session.lock.acquire(), wait)
        session.lock.release()
    except (asyncio.TimeoutError, TimeoutError):
        logger.warning("session %s: its env is still busy after %g s; closing it", session.id, wait)
    try:
        await asyncio.to_thread(session.env.close)
    except Exception:
        logger.warning("session %s: closing its env raised", session.id, exc_info=True)
