"""Settings and the entry point of ``envhub serve``: an env behind uvicorn.

:func:`build_app` makes the ASGI app (tests and embedders run it in their own uvicorn);
:func:`serve` runs it until Ctrl-C or SIGTERM, then closes every session (uvicorn closes the
WebSocket connections with 1012 "service restart", the app's lifespan closes the envs).
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from envhub.errors import MissingDependencyError

logger = logging.getLogger(__name__)


class ServeSettings(BaseModel):
    """How to serve an env."""

    model_config = ConfigDict(frozen=True)

    env: str
    """Anything ``envhub.make`` accepts: a built-in or installed env's name, a Hub reference."""
    env_args: dict[str, Any] = Field(default_factory=dict)
    """Constructor arguments for every session's env; a session's own args update them."""
    host: str = "127.0.0.1"
    port: int = 8765
    max_sessions: int = Field(1024, ge=1)
    token: str | None = None
    """Bearer token clients must send; ``None`` serves without auth."""
    session_ttl: float = Field(600.0, gt=0)
    """Seconds a session may stay idle before it is closed."""
    max_message_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    """The largest request frame read; larger ones get a 413 error."""
    threads: int = Field(64, ge=1)
    """Worker threads that run sync envs' calls."""


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
    service = EnvService(
        lambda args: _make(settings, args),
        SessionStore(settings.max_sessions, settings.session_ttl),
        Limits(max_message_bytes=settings.max_message_bytes, session_ttl=settings.session_ttl),
    )
    sweep_every = min(settings.session_ttl / 4, 5.0)
    app = ServeApp(service, names, settings.token, sweep_every, settings.threads)
    return app.starlette()


def uvicorn_config(settings: ServeSettings, app: Any, **overrides: Any) -> Any:
    """uvicorn's config for ``app``: WebSocket frames above 4x the frame limit are cut off by
    uvicorn itself (1009), smaller oversized ones get a clear 413 reply from the app."""
    _require("uvicorn")
    import uvicorn

    options: dict[str, Any] = dict(
        host=settings.host,
        port=settings.port,
        ws_max_size=4 * settings.max_message_bytes,
        timeout_graceful_shutdown=10,
        log_level="info",
        lifespan="on",
    )
    return uvicorn.Config(app, **{**options, **overrides})


def serve(settings: ServeSettings) -> None:
    """Serve ``settings.env`` until interrupted; every session is closed on the way out."""
    import uvicorn

    app = build_app(settings)
    uvicorn.Server(uvicorn_config(settings, app)).run()


def _make(settings: ServeSettings, args: dict[str, Any]) -> Any:
    from envhub.loader import make

    return make(settings.env, **{**settings.env_args, **args})


def _require(module: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise MissingDependencyError.for_extra(module, "serve")
