"""uvicorn's HTTP and WebSocket protocols with a deadline for half-sent requests.

uvicorn closes an HTTP connection left idle between requests (``timeout_keep_alive``), but it
waits forever for a request whose headers or body stop coming, and for a WebSocket frame sent
in part: a client could hold the server's memory and sockets with thousands of them. These
subclasses close such a connection once a request or frame has been in progress for
``read_timeout`` seconds. Time a request spends in the env is not counted: the clock stops
when the request has been read. (A WebSocket connection that sends nothing at all is the app's
idle timeout's: :class:`envhub.serve.app.ServeApp`.)

Only :func:`envhub.serve.server.uvicorn_config` imports this module (it imports uvicorn).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

logger = logging.getLogger(__name__)


class _Deadline:
    """One timer that closes ``transport`` when it fires (re-armed by :meth:`arm`)."""

    def __init__(self, seconds: float, what: str) -> None:
        self.seconds, self.what = seconds, what
        self._timer: asyncio.TimerHandle | None = None

    def arm(self, transport: Any) -> None:
        """Start the clock unless it runs already."""
        if self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.seconds, self._expire, transport)

    def disarm(self) -> None:
        """Stop the clock."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self, transport: Any) -> None:
        self._timer = None
        if not transport.is_closing():
            logger.info("closing a connection: %s not complete after %g s", self.what, self.seconds)
            transport.close()


class TimedHTTPProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, closing a connection whose request (headers and body) is
    not all in ``read_timeout`` seconds after it began (or after the connection opened)."""

    read_timeout = 30.0

    def connection_made(self, transport: Any) -> None:  # noqa: D102 (uvicorn's hook)
        self._deadline = _Deadline(self.read_timeout, "an HTTP request")
        super().connection_made(transport)
        self._deadline.arm(transport)

    def on_message_begin(self) -> None:  # noqa: D102
        super().on_message_begin()
        self._deadline.arm(self.transport)

    def on_message_complete(self) -> None:  # noqa: D102
        self._deadline.disarm()
        super().on_message_complete()

    def handle_websocket_upgrade(self) -> None:  # noqa: D102
        self._deadline.disarm()  # the WebSocket protocol keeps its own clock
        super().handle_websocket_upgrade()

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: D102
        self._deadline.disarm()
        super().connection_lost(exc)


class TimedWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol, closing a connection whose frame has been arriving for
    ``read_timeout`` seconds without being complete (bytes of it wait in the parser's buffer,
    or a fragmented message is under way)."""

    read_timeout = 30.0

    def connection_made(self, transport: Any) -> None:  # noqa: D102 (uvicorn's hook)
        self._deadline = _Deadline(self.read_timeout, "a WebSocket frame")
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:  # noqa: D102
        super().data_received(data)
        reader = getattr(self.conn, "reader", None)  # websockets' parser buffer (13+)
        if getattr(reader, "buffer", None) or self.frames:
            self._deadline.arm(self.transport)
        else:
            self._deadline.disarm()

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: D102
        self._deadline.disarm()
        super().connection_lost(exc)


def protocols(read_timeout: float) -> tuple[type, type]:
    """``(http, ws)`` protocol classes for uvicorn's config, with ``read_timeout``."""
    http = type("TimedHTTPProtocol", (TimedHTTPProtocol,), {"read_timeout": read_timeout})
    ws = type("TimedWebSocketProtocol", (TimedWebSocketProtocol,), {"read_timeout": read_timeout})
    return http, ws
