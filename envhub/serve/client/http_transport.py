"""The ``http://`` transport: one ``POST`` per request over a pooled ``aiohttp`` client."""

from __future__ import annotations

import asyncio
import functools
import json
import ssl
from typing import Any

from envhub.errors import RemoteEnvError, RemoteEnvUnavailableError
from envhub.serve.client.base import MAX_REPLY_BYTES, Transport
from envhub.serve.client.errors import refused


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
        self._proxy = env_proxy(url)
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
            raise refused(self.url, status, body)
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


def env_proxy(url: str) -> str | None:
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
