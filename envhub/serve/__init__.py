"""``envhub serve``: any env as a network service, and the client side of it.

- :mod:`envhub.serve.protocol` — the wire types (pydantic) and the value codec; both sides.
- :mod:`envhub.serve.sessions` — sessions, their answer caches, expiry and metrics.
- :mod:`envhub.serve.service` — turns requests into ``Env`` calls; no transport in it.
- :mod:`envhub.serve.app` — the Starlette app: WebSocket and HTTP routes, auth, size limits.
- :mod:`envhub.serve.server` — settings and the uvicorn entry point.
- :mod:`envhub.serve.remote` — :class:`~envhub.serve.remote.RemoteEnv`, the client: an ``Env``
  whose episodes run on a server (``envhub.make("ws://...")``).
- :mod:`envhub.serve.client` — the client transports that ``RemoteEnv`` uses.

Only ``app`` and ``server`` import Starlette and uvicorn (``pip install 'envhub[serve]'``);
nothing here is imported by ``import envhub``.
"""
