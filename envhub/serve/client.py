"""The client side of ``envhub serve``: an I/O thread and two transports (WebSocket, HTTP).

All network I/O runs on one event loop in a daemon thread, the *I/O loop*. A
:class:`~envhub.remote.RemoteEnv` then works the same from sync code (``reset``/``step`` wait
for the loop), from any event loop (``areset``/``astep`` await it) and from any thread, and its
connection outlives the short-lived loops that sync code may run on. Everything below touches
its state on the I/O loop only.

- :class:`WebSocketTransport` — one connection per server and token, shared by every
  ``RemoteEnv`` of the process; requests are multiplexed by id. A timed-out request is sent
  again with the same id (the server answers it once). When the connection drops, every
  request waiting on it fails with :class:`~envhub.errors.RemoteEnvUnavailableError`, and the
  server closes the sessions opened on it; the next request opens a new connection.
- :class:`HTTPTransport` — one ``POST`` per request over a pooled ``httpx`` client; timeouts and
  connection errors are retried with the same id. Sessions do not depend on a connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from envhub.errors import RemoteEnvError, RemoteEnvUnavailableError
from envhub.serve import protocol as p

logger = logging.getLogger(__name__)

T = TypeVar("T")
MAX_REPLY_BYTES = 256 * 1024 * 1024
"""The largest reply a client reads (a reply carries what the env returned)."""


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
            return self._loop

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
        self._ws: Any = None
        self._pending: dict[str, asyncio.Future[tuple[dict[str, Any], int]]] = {}
        self._connecting = asyncio.Lock()

    def alive(self, generation: int) -> bool:
        """True while the connection that ``generation`` names is open."""
        return self._ws is not None and self.generation == generation

    async def request(
        self, frame: str, request_id: str, timeout: float | None, retries: int
    ) -> tuple[dict[str, Any], int]:
        """Send ``frame``; on a timeout send it again (same id), up to ``retries`` times."""
        from websockets.exceptions import ConnectionClosed

        answer = asyncio.get_running_loop().create_future()
        self._pending[request_id] = answer
        try:
            for _ in range(retries + 1):
                ws = await self._connection()
                try:
                    await ws.send(frame)
                except ConnectionClosed as e:
                    raise RemoteEnvUnavailableError(self._lost(e)) from e
                try:
                    return await asyncio.wait_for(asyncio.shield(answer), timeout)
                except (asyncio.TimeoutError, TimeoutError):
                    logger.warning("%s: no answer in %g s; sending it again", self.url, timeout)
            raise RemoteEnvUnavailableError(
                f"{self.url} did not answer within {timeout:g} s ({retries + 1} tries)"
            )
        finally:
            self._pending.pop(request_id, None)

    async def _connection(self) -> Any:
        async with self._connecting:
            if self._ws is None:
                self._ws = await self._connect()
                self.generation += 1
                asyncio.ensure_future(self._read(self._ws, self.generation))
            return self._ws

    async def _connect(self) -> Any:
        from websockets.asyncio.client import connect
        from websockets.exceptions import InvalidStatus, WebSocketException

        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            return await connect(
                self.url,
                additional_headers=headers,
                max_size=MAX_REPLY_BYTES,
                open_timeout=self.open_timeout,
                compression=None,
            )
        except InvalidStatus as e:
            raise _refused(self.url, e.response.status_code, e.response.body) from None
        except (OSError, asyncio.TimeoutError, TimeoutError, WebSocketException) as e:
            raise RemoteEnvUnavailableError(
                f"cannot reach {self.url} ({type(e).__name__}: {e}); is `envhub serve` running "
                "there?"
            ) from e

    async def _read(self, ws: Any, generation: int) -> None:
        from websockets.exceptions import ConnectionClosed

        error: BaseException | None = None
        try:
            async for frame in ws:
                self._deliver(json.loads(frame), generation)
        except ConnectionClosed as e:
            error = e
        except Exception as e:  # a reply that is not JSON: the peer is no envhub server
            error = e
            await ws.close()
        finally:
            if self._ws is ws:
                self._ws = None
            lost = RemoteEnvUnavailableError(self._lost(error))
            for answer in self._pending.values():
                if not answer.done():
                    answer.set_exception(lost)

    def _deliver(self, reply: dict[str, Any], generation: int) -> None:
        answer = self._pending.get(reply.get("id"))  # an answer to a retry may come twice
        if answer is not None and not answer.done():
            answer.set_result((reply, generation))
        elif reply.get("id") is None:
            logger.warning("%s: %s", self.url, (reply.get("error") or {}).get("message"))

    def _lost(self, error: BaseException | None) -> str:
        why = f"{type(error).__name__}: {error}" if error is not None else "closed"
        return (
            f"the connection to {self.url} was lost ({why}); the server closed the sessions "
            "opened on it"
        )

    async def aclose(self) -> None:
        """Close the connection (the server closes its sessions)."""
        ws, self._ws = self._ws, None
        if ws is not None:
            await ws.close()


class HTTPTransport(Transport):
    """One ``POST`` per request; sessions outlive connections (only their TTL ends them)."""

    def __init__(self, url: str, token: str | None) -> None:
        import httpx

        self.url = url
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        headers["Content-Type"] = "application/json"
        limits = httpx.Limits(max_connections=512, max_keepalive_connections=256)
        self._client = httpx.AsyncClient(headers=headers, limits=limits)

    async def request(
        self, frame: str, request_id: str, timeout: float | None, retries: int
    ) -> tuple[dict[str, Any], int]:
        """POST ``frame``; on a timeout or a connection error, again (same id, with backoff)."""
        import httpx

        error: Exception | None = None
        for attempt in range(retries + 1):
            try:
                response = await self._client.post(self.url, content=frame, timeout=timeout)
            except httpx.TransportError as e:
                error = e
                await asyncio.sleep(min(0.05 * 2**attempt, 1.0))
                continue
            return self._reply(response), 0
        raise RemoteEnvUnavailableError(
            f"no answer from {self.url} after {retries + 1} tries ({type(error).__name__}: "
            f"{error}); is `envhub serve` running there?"
        ) from error

    def _reply(self, response: Any) -> dict[str, Any]:
        try:
            reply = response.json()
        except ValueError:
            reply = None
        if not isinstance(reply, dict) or "ok" not in reply:
            raise _refused(self.url, response.status_code, response.content)
        return reply

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._client.aclose()


_shared: dict[tuple[str, str | None], WebSocketTransport] = {}


async def acquire(url: str, token: str | None, open_timeout: float | None) -> Transport:
    """The transport for ``url``: the process's shared WebSocket one, or a new HTTP one."""
    if url.startswith(("http://", "https://")):
        transport: Transport = HTTPTransport(url, token)
    else:
        transport = _shared.setdefault((url, token), WebSocketTransport(url, token, open_timeout))
    transport.users += 1
    return transport


async def release(transport: Transport) -> None:
    """Let go of ``transport``; its last user closes it."""
    transport.users -= 1
    if transport.users > 0:
        return
    if isinstance(transport, WebSocketTransport):
        _shared.pop((transport.url, transport.token), None)
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
