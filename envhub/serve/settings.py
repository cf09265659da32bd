"""How ``envhub serve`` serves an env: :class:`ServeSettings`, the one place its defaults are
written (``envhub serve``'s options read theirs from it), and the default bounds on a request's
values that the protocol's limits share.

It imports pydantic and nothing heavier (no numpy, no Starlette): the CLI reads it to build
``envhub serve``'s options every time ``envhub`` starts.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

MAX_DEPTH = 32
"""Default nesting levels a request's value (action, options, env args) may have."""
MAX_ITEMS = 100_000
"""Default list elements, dict entries and array elements a request's value may hold."""
MAX_ARRAY_BYTES = 16 * 1024 * 1024
"""Default bytes the numpy arrays of a request's value may take once built."""


class ServeSettings(BaseModel):
    """How to serve an env."""

    model_config = ConfigDict(frozen=True)

    env: str
    """Anything ``envhub.make`` accepts: a built-in or installed env's name, a Hub reference,
    an env reference (``path/to/file.py:Class``)."""
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
    max_depth: int = Field(MAX_DEPTH, ge=2)
    """Nesting levels a request's value (action, options, env args) may have (413 above)."""
    max_items: int = Field(MAX_ITEMS, ge=16)
    """List elements, dict entries and array elements a request's value may hold (413 above)."""
    max_array_bytes: int = Field(MAX_ARRAY_BYTES, ge=0)
    """Bytes the numpy arrays a request's value declares may take once built (413 above)."""
    max_in_flight: int = Field(1024, ge=1)
    """Requests one WebSocket connection may have running at once (a batch's count one by one);
    reading its frames waits beyond it."""
    idle_timeout: float | None = Field(None, gt=0)
    """Seconds a WebSocket connection may go without a frame while none of its requests runs
    (an env step's time is never idle time) before the server closes it; ``None``: twice the
    session TTL (its sessions expire first, with the clearer error)."""
    read_timeout: float = Field(30.0, gt=0)
    """Seconds a half-sent HTTP request or WebSocket frame may take to arrive in full before the
    server closes the connection."""
