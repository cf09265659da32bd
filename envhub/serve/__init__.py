"""``envhub serve``: any env as a network service, and the client side of it.

- :mod:`envhub.serve.protocol` — the wire types (pydantic); both sides.
- :mod:`envhub.serve.codec` — the value codec and the frames' JSON text; both sides.
- :mod:`envhub.serve.bounds` — the server's reading of untrusted frames and values, within
  bounds (depth, items, array bytes) checked before anything is built.
- :mod:`envhub.serve.sessions` — sessions, their answer caches and request numbers (late
  retries), expiry and metrics.
- :mod:`envhub.serve.service` — turns requests into ``Env`` calls; no transport in it.
- :mod:`envhub.serve.app` — the Starlette app: WebSocket and HTTP routes, auth, size limits,
  in-flight limits and fairness between connections, idle connections; a module per job.
- :mod:`envhub.serve.timeouts` — uvicorn's protocols with a deadline for half-sent requests,
  and the WebSocket protocol's direct line to the app.
- :mod:`envhub.serve.server` — settings (every limit) and the uvicorn entry point.
- :mod:`envhub.serve.remote` — :class:`~envhub.serve.remote.RemoteEnv`, the client: an ``Env``
  whose episodes run on a server (``envhub.make("ws://...")``).
- :mod:`envhub.serve.client` — the client side that ``RemoteEnv`` uses: the I/O thread, the
  shared and per-loop transports (WebSocket, HTTP), framing and time-outs; a module per job.

Only ``app`` and ``server`` import Starlette and uvicorn (``pip install 'envhub[serve]'``);
nothing here is imported by ``import envhub``.
"""
