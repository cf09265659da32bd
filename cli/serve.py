"""``envhub serve``: serve an env over WebSocket and HTTP, a session per client env.

Each option that fills a :class:`~envhub.serve.settings.ServeSettings` field takes its default
from that field (:func:`_setting`): the settings model is the one place a default is written.
"""

from __future__ import annotations

from typing import Any

import typer

from envhub.cli.options import settings_option
from envhub.serve.settings import ServeSettings


def register(app: typer.Typer) -> None:
    """Add the ``envhub serve`` command to ``app``."""
    app.command("serve")(serve_command)


def _setting(name: str, *flags: str, help: str, **options: Any) -> Any:
    """The option ``--NAME`` (with ``flags`` beside it) for the settings field ``name``, its
    default the field's."""
    return settings_option(ServeSettings, name, *flags, help=help, **options)


def serve_command(
    env: str = typer.Argument(
        ...,
        help="An env name (built-in or installed), a Hub reference, or your env's code "
        "(path/to/file.py[:Class], module:Class): anything envhub.make takes.",
    ),
    host: str = _setting("host", help="Address to listen on."),
    port: int = _setting("port", "-p", help="Port to listen on."),
    arg: list[str] = typer.Option(
        [],
        "--arg",
        "-a",
        help="KEY=VALUE constructor argument of the env (VALUE read as JSON "
        "when it parses); repeatable. A client's own arguments override these.",
    ),
    max_sessions: int = _setting(
        "max_sessions", help="Sessions open at once; more are refused (503)."
    ),
    token: str = _setting(
        "token",
        envvar="ENVHUB_SERVE_TOKEN",
        help="Bearer token clients must send (default: $ENVHUB_SERVE_TOKEN; none: no auth).",
    ),
    session_ttl: float = _setting(
        "session_ttl", help="Seconds a session may stay idle before it is closed."
    ),
    max_message_bytes: int = _setting(
        "max_message_bytes", help="Largest request accepted (413 above)."
    ),
    max_depth: int = _setting(
        "max_depth",
        help="Nesting levels a request's value (action, options, env args) may have (413 above).",
    ),
    max_items: int = _setting(
        "max_items",
        help="List elements, dict entries and array elements a "
        "request's value may hold (413 above).",
    ),
    max_array_bytes: int = _setting(
        "max_array_bytes",
        help="Bytes the numpy arrays a request's value declares may take once built (413 above).",
    ),
    max_in_flight: int = _setting(
        "max_in_flight",
        help="Requests one WebSocket connection may have running at "
        "once (a batch's count one by one); reading waits beyond it.",
    ),
    idle_timeout: float = _setting(
        "idle_timeout",
        help="Seconds a WebSocket connection may go without a frame "
        "while none of its requests runs, before it is closed (default: twice --session-ttl).",
    ),
    read_timeout: float = _setting(
        "read_timeout",
        help="Seconds a half-sent HTTP request or WebSocket frame may "
        "take to arrive in full before the connection is closed.",
    ),
    protocol: str = typer.Option(
        "envhub",
        "--protocol",
        help="Wire protocol: `envhub` (RemoteEnv's) or `openenv` (OpenEnv's /ws, /reset, "
        "/step, /state, /health: OpenEnv's own clients drive the env; no token).",
    ),
) -> None:
    """Serve ENV over WebSocket and HTTP: one session (env instance) per client env.

    ws://HOST:PORT/ENV carries many sessions per connection; POST
    http://HOST:PORT/ENV takes one request per call. GET /healthz and
    /metrics (Prometheus) report on the server. Ctrl-C closes every session.

    Clients use it like a local env:
        envhub.make("ws://HOST:PORT/ENV?max_turns=3")

    With --protocol openenv the env speaks OpenEnv's protocol instead: a
    session per WebSocket on ws://HOST:PORT/ws, one shared episode on POST
    /reset and /step; OpenEnv's GenericEnvClient(base_url=...) drives it.

    Examples:
        envhub serve calculator
        envhub serve calculator --protocol openenv --port 8000
        envhub serve calculator --arg max_turns=4 --port 9000 --token s3cret
        envhub serve wordle --host 0.0.0.0 --max-sessions 256 --session-ttl 120
    """
    from envhub.errors import ConfigError

    if protocol not in ("envhub", "openenv"):
        raise ConfigError(f"--protocol takes envhub or openenv, not {protocol!r}")
    settings = ServeSettings(
        env=env,
        env_args=_env_args(arg),
        host=host,
        port=port,
        max_sessions=max_sessions,
        token=token or None,
        session_ttl=session_ttl,
        max_message_bytes=max_message_bytes,
        max_depth=max_depth,
        max_items=max_items,
        max_array_bytes=max_array_bytes,
        max_in_flight=max_in_flight,
        idle_timeout=idle_timeout,
        read_timeout=read_timeout,
    )
    if protocol == "openenv":
        _serve_openenv(settings)
    else:
        _serve_envhub(settings)


def _env_args(items: list[str]) -> dict[str, Any]:
    """The env's constructor arguments from ``--arg KEY=VALUE`` items (VALUE read as JSON when
    it parses)."""
    from envhub.errors import ConfigError
    from envhub.serve.remote import parse_value

    env_args = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--arg takes KEY=VALUE, got {item!r}")
        env_args[key] = parse_value(value)
    return env_args


def _serve_envhub(settings: ServeSettings) -> None:
    """Serve in envhub's protocol (``RemoteEnv``'s) until interrupted."""
    from envhub.serve.server import serve

    host, port, env = settings.host, settings.port, settings.env
    auth = "with a bearer token" if settings.token else "without auth"
    _announce(settings, f"ws://{host}:{port}/{env} and http://{host}:{port}/{env} ({auth})")
    serve(settings)


def _serve_openenv(settings: ServeSettings) -> None:
    """Serve in OpenEnv's protocol until interrupted; a token or a bad env fails before the
    banner (building the app makes one env first)."""
    from envhub.serve.openenv_protocol import build_openenv_app, serve_openenv

    app = build_openenv_app(settings)
    address = f"{settings.host}:{settings.port}"
    _announce(settings, f"http://{address} in the OpenEnv protocol (sessions on ws://{address}/ws)")
    serve_openenv(settings, app)


def _announce(settings: ServeSettings, where: str) -> None:
    """The one line on stderr that says what is served where."""
    from envhub.cli.console import err_console

    text = f"serving {settings.env} on {where}"
    err_console.print(text, markup=False, highlight=False, soft_wrap=True)
