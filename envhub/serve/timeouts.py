"""uvicorn's HTTP and WebSocket protocols with a deadline for half-sent requests.

uvicorn closes an HTTP connection left idle between requests (``timeout_keep_alive``), but it
waits forever for a request whose headers or body stop coming, and for a WebSocket frame sent
in part: a client could hold the server's memory and sockets with thousands of them. These
subclasses close such a connection once a request or frame has been in progress for
``read_timeout`` seconds. Time a request spends in the env is not counted: the clock stops
when the request has been read. (A WebSocket connection that sends nothing at all is the app's
idle timeout's: :class:`envhub.serve.app.ServeApp`.)

The WebSocket protocol also gives the app a direct line to the socket (see
:class:`TimedWebSocketProtocol`), and stops reading the socket only once a frame already waits
for the app (uvicorn stops at every frame and starts again when the app took it: a change of
the event loop's polling of the socket, twice per request).

Only :func:`envhub.serve.server.uvicorn_config` imports this module (it imports uvicorn).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.exceptions import InvalidState

from envhub.serve.app import DIRECT_CHARS, DIRECT_LINE

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


_UVICORN_INTERNALS = (
    "frames", "queue", "read_paused", "close_sent", "conn", "writable",
    "disconnected", "handshake_complete", "initial_response", "transport",
)  # fmt: skip
"""uvicorn's (0.54) WebSocket protocol attributes that :class:`TimedWebSocketProtocol` reads."""


class TimedWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's WebSocket protocol, closing a connection whose frame has been arriving for
    ``read_timeout`` seconds without being complete (bytes of it wait in the parser's buffer,
    or a fragmented message is under way).

    It also offers the app a direct line (the ``envhub.direct_line`` scope extension, this
    object): a text frame is first offered to :attr:`direct` where its bytes arrive (the app
    takes it, or leaves it to be queued for its ``receive`` as usual), and :meth:`send_now`
    writes a frame without the ASGI ``send``'s coroutines.
    """

    read_timeout = 30.0
    _internals_known = False
    """Whether :meth:`_knows_uvicorn` held when the handshake completed."""
    direct: Callable[[str], bool] | None = None
    """Set by the app: takes a text frame (``True``) or leaves it to the queue (``False``)."""

    def handle_connect(self, event: Any) -> None:  # noqa: D102
        super().handle_connect(event)
        scope = getattr(self, "scope", None)  # (none when the handshake was refused)
        self._internals_known = self._knows_uvicorn()
        if scope is not None and self._internals_known:
            scope["extensions"][DIRECT_LINE] = self

    def _knows_uvicorn(self) -> bool:
        """Whether this uvicorn's protocol has the internals the direct line and the read
        pausing use (checked on the live object: a uvicorn that renamed them serves as plain
        uvicorn does instead of failing on every frame)."""
        return all(hasattr(self, name) for name in _UVICORN_INTERNALS)

    def send_now(self, text: str) -> bool:
        """Write a text frame now, if the connection is open and the socket takes more;
        ``False``: send it through the ASGI ``send`` instead (it waits, or raises)."""
        if (
            self.close_sent
            or self.disconnected
            or not self.handshake_complete
            or self.initial_response is not None
            or not self.writable.is_set()
        ):
            return False
        try:
            self.conn.send_text(text.encode())
        except InvalidState:
            return False
        self.transport.write(b"".join(self.conn.data_to_send()))
        return True

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

    def send_receive_event_to_app(self) -> None:  # noqa: D102
        if not self._internals_known:
            super().send_receive_event_to_app()
            return
        if self.direct is not None and self._offered():
            return
        # uvicorn stops reading the socket at every frame until the app has taken it (the loop
        # stops and restarts polling it, for each request of a client that waits for
        # each answer). Reading stops once a frame already waits: the app still has at most
        # two frames waiting for it (and what one read of the socket brought).
        if self.read_paused or not self.queue.empty():
            super().send_receive_event_to_app()
            return
        self.read_paused = True  # so that uvicorn does not stop reading for this frame
        try:
            super().send_receive_event_to_app()
        finally:
            self.read_paused = False

    def _offered(self) -> bool:
        """Offer a whole text frame to the app's direct line; whether it took it."""
        kind = getattr(self, "curr_msg_data_type", None)  # set by uvicorn at a frame's start
        if kind != "text" or len(self.frames) != 1 or self.close_sent:
            return False
        if not self.queue.empty() or len(self.frames[0]) > DIRECT_CHARS:
            return False  # frames wait for the app's receive (this one goes after them); large
        try:
            text = self.frames[0].decode()
        except UnicodeDecodeError:
            return False  # uvicorn's own handling closes the connection
        try:
            taken = self.direct(text)
        except Exception:  # a bug of the app's: the reader reads the frame instead
            logger.exception("the direct line failed on a frame")
            taken = False
        if taken:
            self.frames = []
        return taken


def protocols(read_timeout: float) -> tuple[type, type]:
    """``(http, ws)`` protocol classes for uvicorn's config, with ``read_timeout``."""
    http = type("TimedHTTPProtocol", (TimedHTTPProtocol,), {"read_timeout": read_timeout})
    ws = type("TimedWebSocketProtocol", (TimedWebSocketProtocol,), {"read_timeout": read_timeout})
    return http, ws
