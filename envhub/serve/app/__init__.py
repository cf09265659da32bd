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

One job per module:

- :mod:`~envhub.serve.app.factory` — :class:`ServeApp`: the routes table and the lifecycle
  (the worker threads, the sweep of expired sessions and idle connections).
- :mod:`~envhub.serve.app.ws_route`, :mod:`~envhub.serve.app.post_route`,
  :mod:`~envhub.serve.app.status_routes` — a module per route.
- :mod:`~envhub.serve.app.guards` — the token, the env's name, the size limit.
- :mod:`~envhub.serve.app.fairness` — places, turns and pacing between connections.
- :mod:`~envhub.serve.app.outbox` — replies on their way out of a WebSocket connection.
"""

from envhub.serve.app.factory import ServeApp
from envhub.serve.app.fairness import (
    CONTENDED_FOR,
    FAIR_SHARE,
    MAX_IN_FLIGHT,
    PACE,
    PACED_CHARS,
    PARSE_RATE,
    READ_RATE,
    TURNS,
    Connection,
    Floor,
)
from envhub.serve.app.outbox import BATCH_BYTES, CHUNK, Outbox
from envhub.serve.app.ws_route import BATCH_HEADER, DIRECT_CHARS, DIRECT_LINE

__all__ = [
    "BATCH_BYTES",
    "BATCH_HEADER",
    "CHUNK",
    "CONTENDED_FOR",
    "DIRECT_CHARS",
    "DIRECT_LINE",
    "FAIR_SHARE",
    "MAX_IN_FLIGHT",
    "PACE",
    "PACED_CHARS",
    "PARSE_RATE",
    "READ_RATE",
    "TURNS",
    "Connection",
    "Floor",
    "Outbox",
    "ServeApp",
]
