"""``envhub serve``: serve an env over WebSocket and HTTP, a session per client env."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the ``envhub serve`` command to ``app``."""
    app.command("serve")(serve_command)


def serve_command(
    env: str = typer.Argument(
        ...,
        help="An env name (built-in or installed), a Hub reference, or your env's code "
        "(path/to/file.py[:Class], module:Class): anything envhub.make takes.",
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8765, "--port", "-p", help="Port to listen on."),
    arg: list[str] = typer.Option(
        [],
        "--arg",
        "-a",
        help="KEY=VALUE constructor argument of the env (VALUE read as JSON "
        "when it parses); repeatable. A client's own arguments override these.",
    ),
    max_sessions: int = typer.Option(
        1024, "--max-sessions", help="Sessions open at once; more are refused (503)."
    ),
    token: str = typer.Option(
        None,
        "--token",
        envvar="ENVHUB_SERVE_TOKEN",
        help="Bearer token clients must send (default: $ENVHUB_SERVE_TOKEN; none: no auth).",
    ),
    session_ttl: float = typer.Option(
        600.0, "--session-ttl", help="Seconds a session may stay idle before it is closed."
    ),
    max_message_bytes: int = typer.Option(
        4 * 1024 * 1024, "--max-message-bytes", help="Largest request accepted (413 above)."
    ),
    max_depth: int = typer.Option(
        32,
        "--max-depth",
        help="Nesting levels a request's value (action, options, env args) may have (413 above).",
    ),
    max_items: int = typer.Option(
        100_000,
        "--max-items",
        help="List elements, dict entries and array elements a "
        "request's value may hold (413 above).",
    ),
    max_array_bytes: int = typer.Option(
        16 * 1024 * 1024,
        "--max-array-bytes",
        help="Bytes the numpy arrays a request's value declares may take once built (413 above).",
    ),
    max_in_flight: int = typer.Option(
        1024,
        "--max-in-flight",
        help="Requests one WebSocket connection may have running at "
        "once (a batch's count one by one); reading waits beyond it.",
    ),
    idle_timeout: float = typer.Option(
        None,
        "--idle-timeout",
        help="Seconds a WebSocket connection may go without a frame "
        "while none of its requests runs, before it is closed (default: twice --session-ttl).",
    ),
    read_timeout: float = typer.Option(
        30.0,
        "--read-timeout",
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
    from envhub.cli.console import err_console
    from envhub.errors import ConfigError
    from envhub.serve.remote import parse_value
    from envhub.serve.server import ServeSettings, serve

    if protocol not in ("envhub", "openenv"):
        raise ConfigError(f"--protocol takes envhub or openenv, not {protocol!r}")
    env_args = {}
    for item in arg:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--arg takes KEY=VALUE, got {item!r}")
        env_args[key] = parse_value(value)
    settings = ServeSettings(
        env=env,
        env_args=env_args,
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
    auth = "with a bearer token" if settings.token else "without auth"
    where = f"ws://{host}:{port}/{env} and http://{host}:{port}/{env} ({auth})"
    if protocol == "openenv":
        from envhub.serve.openenv_protocol import build_openenv_app, serve_openenv

        app = build_openenv_app(settings)  # a token or a bad env fails before the banner
        where = f"http://{host}:{port} in the OpenEnv protocol (sessions on ws://{host}:{port}/ws)"
    err_console.print(f"serving {env} on {where}", markup=False, highlight=False, soft_wrap=True)
    if protocol == "openenv":
        serve_openenv(settings, app)
    else:
        serve(settings)
