"""The client side of ``envhub serve``: an I/O thread, per-loop connections, two transports.

Sessions are opened and closed on one event loop in a daemon thread, the *I/O loop*, over a
connection shared by every :class:`~envhub.serve.remote.RemoteEnv` of the process (refcounted); the
sync ``reset``/``step`` run there too, so they work from any thread and outlive the short-lived
loops that sync code may run on. ``areset``/``astep`` instead run on the caller's own loop, over
that loop's own connection (:func:`nearby`): handing each request to another thread and its
answer back costs about 100 us, more than the rest of a request. A session is not tied to the
connection a request comes over, only to the one that opened it (the I/O loop's).

- :class:`WebSocketTransport` — one connection; requests are multiplexed by id. websockets'
  client opens it; then :class:`~envhub.serve.client.wire.Wire` drives its bytes with
  websockets' sans-I/O protocol (replies are handed to their requests where their bytes
  arrive). A request alone on the connection goes out at once; the others (many sessions
  stepping together) are sent together by a writer task, as one frame (a JSON array) when the
  server takes batches (``envhub-batch`` handshake header). A timed-out request is sent again
  with the same id (the server answers it once). When the connection drops, every request
  waiting on it fails with :class:`~envhub.errors.RemoteEnvUnavailableError`, and the server
  closes the sessions opened on it; the next request opens a new connection.
- :class:`HTTPTransport` — one ``POST`` per request over a pooled ``aiohttp`` client; timeouts
  and connection errors are retried with the same id. Sessions do not depend on a connection.

A loop's own transport is closed when the loop shuts down (``asyncio.run`` cancels its guard).

One job per module:

- :mod:`~envhub.serve.client.ioloop` — the I/O loop (:data:`IO`).
- :mod:`~envhub.serve.client.pool` — which transport a request goes over (:func:`acquire`,
  :func:`release`, :func:`nearby`).
- :mod:`~envhub.serve.client.base` — the :class:`Transport` interface and the limits.
- :mod:`~envhub.serve.client.ws_transport` — requests over one WebSocket connection.
- :mod:`~envhub.serve.client.wire` — that connection's bytes (an ``asyncio.Protocol``).
- :mod:`~envhub.serve.client.framing` — RFC 6455 frames of whole messages.
- :mod:`~envhub.serve.client.deadlines` — request time-outs, one timer per transport.
- :mod:`~envhub.serve.client.http_transport` — one ``POST`` per request.
- :mod:`~envhub.serve.client.errors` — error replies as exceptions.
"""

from envhub.serve.client.base import BATCH_HEADER, MAX_REPLY_BYTES, Transport
from envhub.serve.client.deadlines import Deadlines
from envhub.serve.client.errors import raise_for_error
from envhub.serve.client.http_transport import HTTPTransport
from envhub.serve.client.ioloop import IO, IOLoop
from envhub.serve.client.pool import acquire, nearby, release
from envhub.serve.client.ws_transport import WebSocketTransport

__all__ = [
    "BATCH_HEADER",
    "IO",
    "MAX_REPLY_BYTES",
    "Deadlines",
    "HTTPTransport",
    "IOLoop",
    "Transport",
    "WebSocketTransport",
    "acquire",
    "nearby",
    "raise_for_error",
    "release",
]
