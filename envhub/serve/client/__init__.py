"""The client side of ``envhub serve``: an I/O thread, per-loop connections, two transports.

Sessions are opened and closed on one event loop in a daemon thread, the *I/O loop*, over a
connection shared by every :class:`~envhub.serve.remote.RemoteEnv` of the process (refcounted); the
sync ``reset``/``step`` run there too, so they work from any thread and outlive the short-lived
loops that sync code may run on. ``areset``/``astep`` instead run on the caller's own loop, over
that loop's own connection (:func:`nearby`): handing each request to another thread and its
answer back costs about 100 us, more than the rest of a request. A session is not tied to the
connection a request comes over, only to the one that opened it (the I/O loop's).

- :class:`WebSocketTransport` — one connection; requests are multiplexed by id. websockets'
  client opens it; then :class:`_Wire` drives its bytes with websockets' sans-I/O protocol
  (replies are handed to their requests where their bytes arrive). A request
  alone on the connection goes out at once; the others (many sessions stepping together) are
  sent together by a writer task, as one frame (a JSON array) when the server takes batches
  (``envhub-batch`` handshake header). A timed-out
  request is sent again with the same id (the server answers it once). When the connection
  drops, every request waiting on it fails with :class:`~envhub.errors.RemoteEnvUnavailableError`,
  and the server closes the sessions opened on it; the next request opens a new connection.
- :class:`HTTPTransport` — one ``POST`` per request over a pooled ``aiohttp`` client; timeouts
  and connection errors are retried with the same id. Sessions do not depend on a connection.

A loop's own transport is closed when the loop shuts down (``asyncio.run`` cancels its guard).
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import json
import logging
import math
import os
import ssl
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from envhub.errors import RemoteEnvError, RemoteEnvUnavailableError
from envhub.serve import protocol as p

logger = logging.getLogger(__name__)

T = TypeVar("T")
BATCH_HEADER = "envhub-batch"
"""Asks the server for batches; its answer is the largest batch frame it takes."""
MAX_REPLY_BYTES = 256 * 1024 * 1024
"""The largest reply a client reads (a reply carries what the env returned)."""


class _ConnectionLost(RemoteEnvUnavailableError):
    """The connection a request went over dropped (the request may be sent again)."""


class IOLoop:
    """An event loop in a daemon thread, started on first use."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def loop(self) -> asyncio.AbstractEventLoop:
        """The running I/O loop."""
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(
                    target=self._loop.run_forever, name="envhub-remote-io", daemon=True
                ).start()
                atexit.register(self._close_at_exit)
            return self._loop

    def _close_at_exit(self) -> None:
        """Close the connections of envs never closed: their servers end those sessions now,
        not at their TTL, and aiohttp does not log an unclosed pool at exit."""
        if self._loop is None or not _shared:
            return
        try:
            asyncio.run_coroutine_threadsafe(_close_shared(), self._loop).result(timeout=2)
        except Exception:  # the process is exiting: nothing is left to tell
            logger.debug("closing the remote envs' connections at exit failed", exc_info=True)

    def is_current(self) -> bool:
        """Whether the caller runs on the I/O loop."""
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the I/O loop and wait for its result (sync code)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop()).result()

    async def arun(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the I/O loop and await its result from another loop; cancelling
        the caller cancels it."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop()))


IO = IOLoop()


class Transport:
    """Carries frames to one server and their replies back."""

    url: str
    token: str | None
    users: int = 0
    """RemoteEnvs using it (a shared transport closes when the last one lets go)."""

    def alive(self, generation: int) -> bool:
        """Whether sessions opened in ``generation`` (of the connection) still exist."""
        return True

    async def request(
        self, frame: str, request_id: str, timeout: float | None, retries: int
    ) -> tuple[dict[str, Any], int]:
        """``(reply, generation)``: the reply to ``frame`` and the connection it came over."""
        raise NotImplementedError

    async def aclose(self) -> None:
        """Close the connection(s)."""


class WebSocketTransport(Transport):
    """Requests multiplexed over one WebSocket connection (reopened when it drops)."""

    def __init__(self, url: str, token: str | None, open_timeout: float | None) -> None:
        self.url, self.token, self.open_timeout = url, token, open_timeout
        self.generation = 0
        self._ws: _Wire | None = None
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
                except _ConnectionLost:
                    if attempt == retries:
                        raise
                    continue
                finally:
                    self._deadlines.forget(answer)
                if reply is not _TIMED_OUT:
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

    async def _connection(self) -> _Wire:
        async with self._connecting:
            if self._ws is None:
                connection = await self._connect()
                self.generation += 1
                self._batch_bytes = int(connection.response.headers.get(BATCH_HEADER) or 0)
                self._ws = wire = _Wire(self, connection, self.generation)
                # What was queued for the old connection failed with it.
                self._outbox, self._ready = [], asyncio.Event()
                self._writer = asyncio.ensure_future(self._write(wire, self._outbox, self._ready))
            return self._ws

    async def _connect(self) -> Any:
        """A connection opened (handshake, TLS, proxy) by websockets' own client, without its
        keepalive pings: :class:`_Wire` takes its bytes over."""
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
            raise _refused(self.url, e.response.status_code, e.response.body) from None
        except (OSError, asyncio.TimeoutError, TimeoutError, WebSocketException) as e:
            raise RemoteEnvUnavailableError(
                f"cannot reach {self.url} ({type(e).__name__}: {e}); is `envhub serve` running "
                "there?"
            ) from e

    async def _write(self, wire: _Wire, outbox: list[str], ready: asyncio.Event) -> None:
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
        except _ConnectionLost:
            pass

    def _received(self, text: str | bytes, wire: _Wire) -> None:
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

    def _dropped(self, wire: _Wire, error: BaseException | None) -> None:
        """``wire``'s connection is gone: fail what waits on it."""
        if self._ws is wire:
            self._ws = None
            if self._writer is not None:
                self._writer.cancel()
        lost = _ConnectionLost(self._lost(error))
        for answer in self._pending.values():
            if not answer.done():
                answer.set_exception(lost)

    def _lost(self, error: BaseException | None) -> str:
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


class _Wire(asyncio.Protocol):
    """The bytes of one open WebSocket connection, driven by websockets' sans-I/O protocol.

    websockets' client opens the connection; then this protocol takes the socket over
    (``transport.set_protocol``): a frame is parsed where its bytes arrive and its replies are
    handed to the waiting requests there, and a request's frame is written at once, with no
    reader task, message queue or send lock between (about a third of the client's time per
    request at one session went to those, and one loop iteration).

    The frames of every request and reply (whole text or binary messages, masked when sent as
    RFC 6455 asks) are read and written here (:class:`_Frames`); websockets' protocol reads
    every other frame (pings, a closing handshake, fragments), each given to it whole, and
    keeps the connection's state (once it saw a fragment or an oversized frame, it reads all
    that follows)."""

    def __init__(self, owner: WebSocketTransport, connection: Any, generation: int) -> None:
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
        self._frames: _Frames | None = _Frames()
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
            if kind == _TEXT:
                try:
                    text = payload.decode()
                except UnicodeDecodeError as e:  # not UTF-8: websockets closes with 1007
                    self.close_with(e)
                    return
                self.owner._received(text, self)
            elif kind == _BINARY:
                self.owner._received(payload, self)
            else:  # a control frame (given whole), or the rest once websockets reads it all
                if kind == _REST:
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
        self.owner._dropped(self, exc or self._close_error())

    def pause_writing(self) -> None:  # noqa: D102
        self.paused = True

    def resume_writing(self) -> None:  # noqa: D102
        self.paused = False
        self._wake_writers()

    # -- the transport's side ----------------------------------------------------------------

    def send(self, frame: str) -> None:
        """Write a text frame now.

        Raises:
            _ConnectionLost: The connection is closing or gone.
        """
        if self._gone.done() or self.transport.is_closing():
            if self.owner._ws is self:  # the next try opens a new connection
                self.owner._ws = None
            raise _ConnectionLost(self.owner._lost(self._close_error()))
        if self._frames is not None and self.protocol.state is self._open:
            self.transport.write(self._frames.text(frame.encode()))
            return
        try:
            self.protocol.send_text(frame.encode())
        except Exception as e:  # websockets' InvalidState: a close is under way
            raise _ConnectionLost(self.owner._lost(e)) from e
        self._flush()

    async def drained(self) -> None:
        """Wait until the socket takes more (the server reads again, or the connection ends)."""
        while self.paused and not self._gone.done():
            self._resumed = asyncio.get_running_loop().create_future()
            await self._resumed

    def close_with(self, error: BaseException) -> None:
        """Drop the connection because of ``error`` (what waits on it fails with it)."""
        self.transport.abort()
        self.owner._dropped(self, error)

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
            self.owner._received(
                frame.data if opcode is not self._data_opcodes[0] else frame.data.decode(), self
            )
            return
        self._parts.append(frame.data)
        if frame.fin:
            data, self._parts = b"".join(self._parts), []
            self.owner._received(data, self)

    def _flush(self) -> None:
        for data in self.protocol.data_to_send():
            if data:
                self.transport.write(data)
            elif self.transport.can_write_eof():
                self.transport.write_eof()

    def _wake_writers(self) -> None:
        if self._resumed is not None and not self._resumed.done():
            self._resumed.set_result(None)


_TEXT, _BINARY, _CONTROL, _REST = range(4)
"""What :meth:`_Frames.read` found: a text or binary message, a control frame, or the rest of
the bytes (for websockets' protocol to read)."""


class _Frames:
    """The client's side of RFC 6455 framing for whole messages: reads the server's frames
    (unmasked) and writes text frames (masked with a random key each, as the RFC asks)."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._need = 2
        """Bytes the buffer must hold before the next frame can be read."""
        self._keys = b""
        self._key_at = 0
        self._apply_mask = _masker()

    def read(self, data: bytes) -> list[tuple[int, bytes]]:
        """The whole frames in ``data`` and the bytes before it, as ``(kind, payload)``; a
        control frame's payload is the whole frame (for websockets' protocol), and once a frame
        is one of neither (a fragment, a masked or oversized one), the rest of the bytes are."""
        buffer = self._buffer
        if not buffer and len(data) >= 2:  # the common case: whole frames in one read
            buffer = memoryview(data)
        else:
            buffer.extend(data)
            if len(buffer) < self._need:
                return []
        found: list[tuple[int, bytes]] = []
        at, end = 0, len(buffer)
        while end - at >= 2:
            head, second = buffer[at], buffer[at + 1]
            length, start = second & 0x7F, at + 2
            if length == 126:
                length, start = int.from_bytes(buffer[at + 2 : at + 4], "big"), at + 4
            elif length == 127:
                length, start = int.from_bytes(buffer[at + 2 : at + 10], "big"), at + 10
            if start > end:  # the length's bytes are still to come
                self._need = start - at
                break
            kind = _MESSAGES.get(head)
            if kind is None and not (0x88 <= head <= 0x8A and length <= 125):
                kind = _REST  # (a mask bit from a server is an error websockets reports)
            elif second & 0x80 or length > MAX_REPLY_BYTES:
                kind = _REST
            if kind == _REST:
                found.append((_REST, bytes(buffer[at:])))
                at = end
                break
            if end - start < length:
                self._need = start + length - at
                break
            if kind is None:
                found.append((_CONTROL, bytes(buffer[at : start + length])))
            else:
                found.append((kind, bytes(buffer[start : start + length])))
            at = start + length
        else:
            self._need = 2
        if isinstance(buffer, memoryview):
            self._buffer = bytearray(buffer[at:])
        else:
            del buffer[:at]
        if len(self._buffer) < 2:
            self._need = 2
        return found

    def text(self, payload: bytes) -> bytes:
        """A masked text frame of ``payload`` (UTF-8)."""
        n = len(payload)
        if n < 126:
            head = bytes((0x81, 0x80 | n))
        elif n < 65536:
            head = bytes((0x81, 0xFE)) + n.to_bytes(2, "big")
        else:
            head = bytes((0x81, 0xFF)) + n.to_bytes(8, "big")
        key = self._key()
        return head + key + self._apply_mask(payload, key)

    def _key(self) -> bytes:
        """4 random bytes, from a stock of them read from the OS's generator 1 KB at a time
        (what websockets reads 4 bytes at a time)."""
        if self._key_at >= len(self._keys):
            self._keys, self._key_at = os.urandom(1024), 0
        key = self._keys[self._key_at : self._key_at + 4]
        self._key_at += 4
        return key


_MESSAGES = {0x81: _TEXT, 0x82: _BINARY}
"""A whole message's first byte (FIN, no extension bits, its opcode)."""


@functools.cache
def _masker() -> Any:
    """websockets' ``apply_mask`` (its C one where built), imported when a connection opens."""
    try:
        from websockets.speedups import apply_mask
    except ImportError:  # websockets without its C extension
        from websockets.utils import apply_mask
    return apply_mask


class HTTPTransport(Transport):
    """One ``POST`` per request over an ``aiohttp`` connection pool; sessions outlive
    connections (only their TTL ends them). aiohttp, not httpx: ``bench/serve.py`` steps
    2-4x as fast over it on 2 cores (httpx/httpcore/anyio took ~700 us of client CPU per
    request at 64 sessions)."""

    def __init__(self, url: str, token: str | None) -> None:
        self.url, self.token = url, token
        self._headers = {"Content-Type": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._proxy = _env_proxy(url)
        self._session: Any = None

    def _client(self) -> Any:
        """The pool, made on first use: aiohttp binds it to the running loop."""
        if self._session is None:
            aiohttp = _aiohttp()
            connector = aiohttp.TCPConnector(limit=512, ssl=_tls())
            self._session = aiohttp.ClientSession(headers=self._headers, connector=connector)
        return self._session

    async def request(
        self, frame: str, request_id: str, timeout: float | None, retries: int
    ) -> tuple[dict[str, Any], int]:
        """POST ``frame``; on a timeout or a connection error, again (same id, with backoff)."""
        aiohttp = _aiohttp()
        lost = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError)
        limit = aiohttp.ClientTimeout(total=timeout)
        error: Exception | None = None
        for attempt in range(retries + 1):
            try:
                post = self._client().post(self.url, data=frame, timeout=limit, proxy=self._proxy)
                async with post as response:
                    return self._reply(response.status, await _body(response)), 0
            except lost as e:
                error = e
                await asyncio.sleep(min(0.05 * 2**attempt, 1.0))
        raise RemoteEnvUnavailableError(
            f"no answer from {self.url} after {retries + 1} tries ({type(error).__name__}: "
            f"{error}); is `envhub serve` running there?"
        ) from error

    def _reply(self, status: int, body: bytes) -> dict[str, Any]:
        try:
            reply = json.loads(body)
        except ValueError:
            reply = None
        if not isinstance(reply, dict) or "ok" not in reply:
            raise _refused(self.url, status, body)
        return reply

    async def aclose(self) -> None:
        """Close the connection pool."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()


async def _body(response: Any) -> bytes:
    """The reply's body, refused past :data:`MAX_REPLY_BYTES` (as the WebSocket transport's)."""
    if (response.content_length or 0) > MAX_REPLY_BYTES:
        raise RemoteEnvError(
            f"{response.url} sent a reply of {response.content_length:,} bytes, over the "
            f"client's {MAX_REPLY_BYTES:,}-byte limit"
        )
    return await response.read()


def _env_proxy(url: str) -> str | None:
    """The proxy that ``HTTP(S)_PROXY`` and ``NO_PROXY`` name for ``url``, read once (aiohttp's
    ``trust_env`` reads them, and ``.netrc``, in a thread for every request: a third of a
    step's time at 1 session)."""
    import urllib.request
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if urllib.request.proxy_bypass_environment(parts.hostname or ""):
        return None
    return urllib.request.getproxies_environment().get(parts.scheme)


@functools.cache
def _aiohttp() -> Any:
    """aiohttp, imported once, or an error that says how to get it."""
    try:
        import aiohttp
    except ImportError as e:
        raise RemoteEnvError(
            "http:// env URLs need aiohttp: pip install 'envhub[serve]' (or use the ws:// URL)"
        ) from e
    return aiohttp


@functools.cache
def _tls() -> ssl.SSLContext:
    import httpx

    return httpx.create_ssl_context()


_TIMED_OUT: Any = object()
"""What a request's future holds when its time ran out."""


class Deadlines:
    """Time-outs of a transport's requests, kept by one timer: a watched future holds
    :data:`_TIMED_OUT` once its time is up, noticed within a quarter of the shortest timeout
    being watched. A timer per request, armed and cancelled every time (and the heap of
    cancelled timers the loop then sifts), cost ~6 of the client's ~30 us per step at 64
    sessions."""

    def __init__(self) -> None:
        self._due: dict[asyncio.Future[Any], float] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._tick = math.inf

    def watch(
        self, answer: asyncio.Future[Any], timeout: float, loop: asyncio.AbstractEventLoop
    ) -> None:
        """Time ``answer`` out after ``timeout`` seconds (or up to a tick later)."""
        self._due[answer] = loop.time() + timeout
        tick = max(timeout / 4, 0.005)
        if tick < self._tick:  # checks must come more often: re-arm
            self._tick = tick
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        if self._timer is None:
            self._timer = loop.call_later(self._tick, self._check, loop)

    def forget(self, answer: asyncio.Future[Any]) -> None:
        """Stop watching ``answer`` (it was answered, or failed)."""
        self._due.pop(answer, None)

    def _check(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        for answer in [a for a, due in self._due.items() if due <= now]:
            del self._due[answer]
            if not answer.done():
                answer.set_result(_TIMED_OUT)
        if self._due:
            self._timer = loop.call_later(self._tick, self._check, loop)
        else:
            self._timer, self._tick = None, math.inf


def _new(url: str, token: str | None, open_timeout: float | None) -> Transport:
    if url.startswith(("http://", "https://")):
        return HTTPTransport(url, token)
    return WebSocketTransport(url, token, open_timeout)


_shared: dict[tuple[str, str | None], Transport] = {}
"""The I/O loop's transports (touched on the I/O loop only)."""
_per_loop: dict[tuple[str, str | None, asyncio.AbstractEventLoop], Transport] = {}
"""Other loops' transports, each touched on its own loop only (and by :func:`nearby`)."""
_guards: set[asyncio.Task[None]] = set()


async def acquire(url: str, token: str | None, open_timeout: float | None) -> Transport:
    """The I/O loop's transport for ``url``, shared by its envs (one more user)."""
    transport = _shared.get((url, token))
    if transport is None:
        transport = _shared[(url, token)] = _new(url, token, open_timeout)
    transport.users += 1
    return transport


async def _close_shared() -> None:
    while _shared:
        _, transport = _shared.popitem()
        await transport.aclose()


async def release(transport: Transport) -> None:
    """Let go of an I/O loop transport; its last user closes it."""
    transport.users -= 1
    if transport.users > 0:
        return
    if _shared.get((transport.url, transport.token)) is transport:
        del _shared[(transport.url, transport.token)]
    await transport.aclose()


def nearby(url: str, token: str | None, open_timeout: float | None) -> Transport:
    """The running loop's own transport for ``url``, made on first use and shared by the loop's
    envs; requests from that loop then need no other thread. It closes when the loop shuts
    down."""
    loop = asyncio.get_running_loop()
    key = (url, token, loop)
    transport = _per_loop.get(key)
    if transport is None:
        for old in [k for k in list(_per_loop) if k[2].is_closed()]:  # loops closed uncancelled
            _per_loop.pop(old, None)
        transport = _per_loop[key] = _guarded(_new(url, token, open_timeout), loop, key)
    return transport


def _guarded(transport: Transport, loop: asyncio.AbstractEventLoop, key: Any) -> Transport:
    guard = loop.create_task(_close_with_loop(key, transport))
    _guards.add(guard)
    guard.add_done_callback(_guards.discard)
    return transport


async def _close_with_loop(key: Any, transport: Transport) -> None:
    """Wait for the loop to shut down (``asyncio.run`` cancels every task), then close."""
    try:
        await asyncio.Event().wait()
    finally:
        _per_loop.pop(key, None)
        await transport.aclose()


def raise_for_error(error: dict[str, Any], url: str, op: str) -> None:
    """Raise the client's exception for an error reply.

    Raises:
        RemoteEnvUnavailableError: The session is gone, or the server is full or stopping.
        RemoteEnvError: Anything else: the env raised (its class in ``remote_type``), a bad
            token, a request the server refused.
    """
    info = p.ErrorInfo.model_validate(error)
    if info.type in (p.UNKNOWN_SESSION, p.CAPACITY, p.SHUTTING_DOWN):
        raise RemoteEnvUnavailableError(f"{url}: {info.message}", remote_type=info.type)
    if info.code == 500:
        raise RemoteEnvError(
            f"the env at {url} raised {info.type} in {op}: {info.message}", remote_type=info.type
        )
    if info.type == p.UNAUTHORIZED:
        raise RemoteEnvError(f"{url} refused the token: {info.message}", remote_type=info.type)
    raise RemoteEnvError(
        f"{url} refused the {op} request ({info.code} {info.type}): {info.message}",
        remote_type=info.type,
    )


def _refused(url: str, status: int, body: bytes | None) -> RemoteEnvError:
    """The error for a reply that is not a protocol reply (a denied WebSocket handshake)."""
    try:
        error = json.loads(body or b"")["error"]
        raise_for_error(error, url, "connect")
    except RemoteEnvError as e:
        return e
    except (ValueError, KeyError, TypeError):
        pass
    text = (body or b"")[:200].decode("utf-8", "replace")
    kind = RemoteEnvUnavailableError if status >= 500 else RemoteEnvError
    return kind(f"{url} answered HTTP {status}, not as an envhub server: {text!r}")
