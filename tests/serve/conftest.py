"""A real ``envhub serve`` app under a real uvicorn on 127.0.0.1, in a thread of the test process
(so that envs registered by a test are served, and the server can be stopped on cue)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn

from envhub.serve.server import ServeSettings, build_app, uvicorn_config


@dataclass
class Running:
    settings: ServeSettings
    server: uvicorn.Server
    thread: threading.Thread
    port: int

    def url(self, scheme: str = "ws", env: str | None = None) -> str:
        return f"{scheme}://127.0.0.1:{self.port}/{env if env is not None else self.settings.env}"

    def metrics(self) -> dict[str, float]:
        text = httpx.get(f"http://127.0.0.1:{self.port}/metrics").text
        pairs = (line.rsplit(" ", 1) for line in text.splitlines())
        return {name.removeprefix("envhub_serve_"): float(value) for name, value in pairs}

    def wait_for(self, name: str, value: float, within: float = 5.0) -> None:
        """Wait until the metric ``name`` reads ``value`` (the server acts on its own loop)."""
        deadline = time.monotonic() + within
        while self.metrics()[name] != value:
            assert time.monotonic() < deadline, f"{name} = {self.metrics()[name]}, not {value}"
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        assert not self.thread.is_alive(), "the server did not shut down"


def start(settings: ServeSettings) -> Running:
    """Serve ``settings`` on a free port; returns once the server accepts connections."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn_config(settings, build_app(settings), log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    return Running(settings, server, thread, port)


@pytest.fixture(scope="module")
def serve() -> Iterator[Callable[..., Running]]:
    """``serve(env, **settings)`` starts a server; every one stops when the module ends."""
    running: list[Running] = []

    def _serve(env: str, **settings: Any) -> Running:
        server = start(ServeSettings(env=env, **settings))
        running.append(server)
        return server

    yield _serve
    for server in running:
        if server.thread.is_alive():
            server.stop()
