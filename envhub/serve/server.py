"""The entry point of ``envhub serve``: an env behind uvicorn, as its
:class:`~envhub.serve.settings.ServeSettings` say.

:func:`build_app` makes the ASGI app (tests and embedders run it in their own uvicorn, with
:func:`uvicorn_config`, which brings the half-sent-request deadline);
:func:`serve` runs it (through :func:`run`, which settles the heap first: :func:`settle_heap`)
until Ctrl-C or SIGTERM, then closes every session (uvicorn closes the WebSocket connections
with 1012 "service restart", the app's lifespan closes the envs).
"""

from __future__ import annotations

import logging
from typing import Any

from envhub.errors import MissingDependencyError
from envhub.serve.settings import ServeSettings

logger = logging.getLogger(__name__)


def build_app(settings: ServeSettings) -> Any:
    """The Starlette app serving ``settings.env``. One env is made (and closed) first, so that
    a bad name or bad arguments fail now, with the loader's message, not at the first client.

    Raises:
        MissingDependencyError: Starlette or uvicorn is not installed.
        EnvNotFoundError: No env by that name.
        EnvLoadError: The env rejects the arguments or cannot be made.
    """
    _require("starlette")
    from envhub.serve.app import ServeApp
    from envhub.serve.protocol import Limits
    from envhub.serve.service import EnvService, env_info
    from envhub.serve.sessions import SessionStore

    probe = _make(settings, {})
    names = {settings.env, probe.name}
    env_info(probe)  # reads the package's provenance once (slow), and checks it can be sent
    probe.close()
    limits = Limits(
        max_message_bytes=settings.max_message_bytes,
        session_ttl=settings.session_ttl,
        max_depth=settings.max_depth,
        max_items=settings.max_items,
        max_array_bytes=settings.max_array_bytes,
        request_numbers=True,
    )
    service = EnvService(
        lambda args: _make(settings, args),
        SessionStore(settings.max_sessions, settings.session_ttl),
        limits,
    )
    idle_timeout = settings.idle_timeout or 2 * settings.session_ttl
    sweep_every = min(settings.session_ttl / 4, idle_timeout / 4, 5.0)
    app = ServeApp(
        service,
        names,
        settings.token,
        sweep_every,
        settings.threads,
        idle_timeout=idle_timeout,
        max_in_flight=settings.max_in_flight,
    )
    return app.starlette()


def uvicorn_config(settings: ServeSettings, app: Any, **overrides: Any) -> Any:
    """uvicorn's config for ``app``: WebSocket frames above 4x the frame limit are cut off by
    uvicorn itself (1009), smaller oversized ones get a clear 413 reply from the app; half-sent
    requests and frames are cut off after ``settings.read_timeout``
    (:mod:`envhub.serve.timeouts`, where httptools is installed)."""
    _require("uvicorn")
    import uvicorn

    options: dict[str, Any] = dict(
        host=settings.host,
        port=settings.port,
        ws_max_size=4 * settings.max_message_bytes,
        ws_per_message_deflate=False,  # RemoteEnv never asks; no decompression bombs either
        timeout_graceful_shutdown=10,
        log_level="info",
        lifespan="on",
    )
    try:
        from envhub.serve.timeouts import protocols
    except ImportError:  # uvicorn without httptools: its own protocols, without the deadline
        logger.warning("httptools is not installed: half-sent requests are not timed out")
    else:
        options["http"], options["ws"] = protocols(settings.read_timeout)
    return uvicorn.Config(app, **{**options, **overrides})


def serve(settings: ServeSettings) -> None:
    """Serve ``settings.env`` until interrupted; every session is closed on the way out."""
    run(settings, build_app(settings))


def run(settings: ServeSettings, app: Any, **overrides: Any) -> None:
    """Run ``app`` (either protocol's) under uvicorn until interrupted, the process's heap
    settled first (:func:`settle_heap`); ``overrides``: uvicorn config options."""
    import uvicorn

    server = uvicorn.Server(uvicorn_config(settings, app, **overrides))
    settle_heap()
    server.run()


def settle_heap() -> None:
    """Collect the garbage of start-up, then put every object alive now (modules, classes, the
    app) out of the garbage collector's way (``gc.freeze``): its full collections then walk
    only what serving made since, not the start-up heap (imports of pydantic, numpy, Starlette:
    a stall of every client on the loop each time one ran). For a process that serves; tests
    and embedders that run the app in their own process are left alone."""
    import gc

    gc.collect()
    gc.freeze()


def _make(settings: ServeSettings, args: dict[str, Any]) -> Any:
    from envhub.loader import make

    return make(settings.env, **{**settings.env_args, **args})


def _require(module: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise MissingDependencyError.for_extra(module, "serve")
