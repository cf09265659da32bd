"""Which transport a request goes over: the I/O loop's, shared by every env of the process
(refcounted), or the caller's own loop's (closed when that loop shuts down)."""

from __future__ import annotations

import asyncio
from typing import Any

from envhub.serve.client.base import Transport
from envhub.serve.client.http_transport import HTTPTransport
from envhub.serve.client.ws_transport import WebSocketTransport

shared: dict[tuple[str, str | None], Transport] = {}
"""The I/O loop's transports (touched on the I/O loop only)."""
_per_loop: dict[tuple[str, str | None, asyncio.AbstractEventLoop], Transport] = {}
"""Other loops' transports, each touched on its own loop only (and by :func:`nearby`)."""
_guards: set[asyncio.Task[None]] = set()


def _new(url: str, token: str | None, open_timeout: float | None) -> Transport:
    if url.startswith(("http://", "https://")):
        return HTTPTransport(url, token)
    return WebSocketTransport(url, token, open_timeout)


async def acquire(url: str, token: str | None, open_timeout: float | None) -> Transport:
    """The I/O loop's transport for ``url``, shared by its envs (one more user)."""
    transport = shared.get((url, token))
    if transport is None:
        transport = shared[(url, token)] = _new(url, token, open_timeout)
    transport.users += 1
    return transport


async def release(transport: Transport) -> None:
    """Let go of an I/O loop transport; its last user closes it."""
    transport.users -= 1
    if transport.users > 0:
        return
    if shared.get((transport.url, transport.token)) is transport:
        del shared[(transport.url, transport.token)]
    await transport.aclose()


async def close_shared() -> None:
    """Close every I/O loop transport (the process exits)."""
    while shared:
        _, transport = shared.popitem()
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
