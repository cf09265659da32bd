"""Steps/s of a trivial multi-turn env through ``envhub serve`` against the same env in process.

The env (``bench-echo``) echoes each turn for 8 turns and pays 1 at the end; it is natively
async and does no work, so what is measured is the cost of the transport: frames, JSON,
pydantic, the server's session bookkeeping and the client's connection. The server runs in its
own process (``envhub serve`` machinery, uvicorn, one worker); the clients are ``RemoteEnv``s
driven by ``areset``/``astep`` on one event loop (over that loop's own connection, no thread
hop), at 1, 64 and 1024 concurrent sessions, over WebSocket (all sessions share the loop's
connection; requests made together go out as one frame) and HTTP. On a 2-core machine the
client and the server share the cores.

    .venv/bin/python bench/serve.py [--seconds 3] [--sessions 1 64 1024] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

import envhub
from envhub.defaults import free_port
from envhub.env import Env
from envhub.types import Message, user

TURNS = 8


class Echo(Env):
    """Echoes each turn back; the episode ends after ``TURNS`` turns with reward 1."""

    name = "bench-echo"

    def __init__(self) -> None:
        super().__init__()
        self.turn = 0

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """The prompt: one user message."""
        self.turn = 0
        return [user("say anything")], {}

    async def astep(self, action: Any) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """The action's text, back as a user message."""
        self.turn += 1
        done = self.turn == TURNS
        text = action if isinstance(action, str) else str(action)
        return [user(text)], float(done), done, False, {"turn": self.turn}


def run_server(port: int) -> None:
    """The server process: serve ``Echo`` on ``port`` until killed."""
    from envhub.serve.server import ServeSettings, build_app, run

    envhub.register(Echo.name, Echo, override=True)
    settings = ServeSettings(env=Echo.name, port=port, max_sessions=4096)
    run(settings, build_app(settings), log_level="warning")


def start_server() -> tuple[subprocess.Popen[bytes], int]:
    """Start the server process; return it and its port once it answers."""
    port = free_port()
    process = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz")
            return process, port
        except httpx.TransportError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("the bench server did not start")


async def steps_per_second(envs: list[Env], seconds: float) -> float:
    """Drive every env through episodes for ``seconds``; total steps per second."""
    steps = 0
    deadline = time.perf_counter() + seconds

    async def worker(env: Env) -> None:
        nonlocal steps
        while time.perf_counter() < deadline:
            await env.areset(seed=0)
            done = False
            while not done:
                _, _, done, _, _ = await env.astep("hello there")
                steps += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker(env) for env in envs))
    return steps / (time.perf_counter() - started)


def measure(make: Any, sessions: int, seconds: float) -> float:
    """Steps/s of ``sessions`` envs from ``make``, each closed afterwards."""
    envs = [make() for _ in range(sessions)]
    try:
        return asyncio.run(steps_per_second(envs, seconds))
    finally:
        for env in envs:
            env.close()


def main() -> None:
    """Print the table: steps/s in process, over WebSocket and over HTTP."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 64, 1024])
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return run_server(args.serve)
    process, port = start_server()
    rows: list[dict[str, float]] = []
    try:
        print(f"{'sessions':>8}  {'in-process':>12}  {'websocket':>12}  {'http':>12}  (steps/s)")
        for n in args.sessions:
            local = measure(Echo, n, args.seconds)
            ws = measure(lambda: envhub.make(f"ws://127.0.0.1:{port}/"), n, args.seconds)
            http = measure(lambda: envhub.make(f"http://127.0.0.1:{port}/"), n, args.seconds)
            print(f"{n:>8}  {local:>12,.0f}  {ws:>12,.0f}  {http:>12,.0f}", flush=True)
            rows.append({"sessions": n, "inprocess": local, "websocket": ws, "http": http})
    finally:
        process.kill()
        process.wait()
    if args.json:
        args.json.write_text(json.dumps({"rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
