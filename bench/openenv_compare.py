"""Steps/s of a trivial multi-turn echo env: ``envhub serve`` against OpenEnv's own server.

The same env on three servers, each in its own process (uvicorn, one worker), at 1, 64 and
1024 concurrent sessions; every env is natively async and does no work (8 turns of echo, reward
1 at the end), so what is measured is the transport:

- ``envhub``: ``envhub serve`` driven by ``RemoteEnv`` over WebSocket (every session on the
  event loop's one connection, requests multiplexed by id; a request alone on it goes out at
  once, the others as one frame; the server sends the first reply of a loop iteration at once
  and those finishing with it as one frame);
- ``openenv``: openenv-core's FastAPI app (``create_fastapi_app``, ``max_concurrent_envs`` =
  the session count, the env marked ``SUPPORTS_CONCURRENT_SESSIONS``) driven by its own
  ``GenericEnvClient``: one WebSocket per session, one request in flight on each;
- ``envhub_openenv_protocol``: ``envhub serve --protocol openenv``, driven by OpenEnv's client
  as above (the server alone changes).

Clients connect before the clock starts; every client runs on one event loop in this process.
On a 2-core machine the clients and the server share the cores.

Beside the rates, the CPU that the server and the client process spent per step while the clock
ran (server + client, microseconds): on a shared 2-core machine whose speed drifts between runs,
the steadier measure of what each stack costs.

One more line bounds the 1-session column: a bare uvicorn + Starlette WebSocket echo (no env, no
JSON, no protocol) driven by a bare ``websockets`` client, one message in flight. No server on
this stack answers one session faster than that. The last line splits the 1-session CPU per
step into the server's and the client's, beside the echo's per round trip: what the sockets and
event loops cost with no protocol at all, against what each stack adds.

    .venv/bin/python bench/openenv_compare.py [--seconds 3] [--sessions 1 64 1024] [--json out.json]

JSON: ``{"env": ..., "seconds": s, "cpus": n, "goal": 3.0, "echo_floor": round trips/s,
"echo_floor_server_us"/"echo_floor_client_us": CPU per round trip,
"rows": [{"sessions": n,
"envhub": steps/s, "openenv": steps/s, "envhub_openenv_protocol": steps/s,
"speedup": envhub / openenv, "server_speedup": envhub_openenv_protocol / openenv,
"envhub_cpu_us": server + client CPU us per step (also ``openenv_cpu_us``, ...),
"envhub_server_us"/"envhub_client_us": its two parts (also ``openenv_server_us``, ...)}, ...]}``
(``server_speedup`` compares the servers alone: the same OpenEnv client drives both).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from envhub.defaults import free_port

TURNS = 8
GOAL = 3.0


def envhub_echo() -> type:
    """The envhub env: echoes each turn, ends after ``TURNS`` with reward 1."""
    from envhub.env import Env
    from envhub.types import user

    class Echo(Env):
        """Echoes each turn; reward 1 after the last."""

        name = "bench-echo"

        def __init__(self) -> None:
            super().__init__()
            self.turn = 0

        async def areset(self, *, seed: Any = None, options: Any = None) -> Any:
            """The prompt."""
            self.turn = 0
            return [user("say anything")], {}

        async def astep(self, action: Any) -> Any:
            """The action's text, back."""
            self.turn += 1
            done = self.turn == TURNS
            text = action if isinstance(action, str) else getattr(action, "content", "")
            return [user(text)], float(done), done, False, {"turn": self.turn}

    return Echo


def openenv_app(max_sessions: int) -> Any:
    """The same env written with openenv-core's base classes, in its FastAPI app."""
    from openenv.core.env_server import (
        Action,
        Environment,
        Observation,
        State,
        create_fastapi_app,
    )

    class SayAction(Action):
        """The model's text."""

        message: str

    class EchoObservation(Observation):
        """The text, back."""

        text: str = ""

    class EchoEnvironment(Environment):
        """Echoes each turn; reward 1 after the last (async, like the envhub one)."""

        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self) -> None:
            super().__init__()
            self._state = State(step_count=0)

        def reset(self, seed: Any = None, episode_id: Any = None, **_: Any) -> Any:
            """The prompt."""
            self._state = State(episode_id=episode_id, step_count=0)
            return EchoObservation(text="say anything", reward=0.0)

        def step(self, action: Any, timeout_s: Any = None, **_: Any) -> Any:
            """The action's text, back."""
            self._state.step_count += 1
            done = self._state.step_count == TURNS
            return EchoObservation(text=action.message, done=done, reward=float(done))

        async def reset_async(self, seed: Any = None, episode_id: Any = None, **kw: Any) -> Any:
            """:meth:`reset` on the loop (no worker thread)."""
            return self.reset(seed, episode_id, **kw)

        async def step_async(self, action: Any, timeout_s: Any = None, **kw: Any) -> Any:
            """:meth:`step` on the loop (no worker thread)."""
            return self.step(action, timeout_s, **kw)

        @property
        def state(self) -> State:
            """Episode id and step count."""
            return self._state

    return create_fastapi_app(
        EchoEnvironment, SayAction, EchoObservation, max_concurrent_envs=max_sessions
    )


def bare_echo_app() -> Any:
    """A Starlette app that sends every WebSocket message back: the transport and nothing else."""
    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute

    async def echo(websocket: Any) -> None:
        await websocket.accept()
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            await websocket.send_text(message["text"])

    return Starlette(routes=[WebSocketRoute("/", echo)])


def run_server(kind: str, port: int, max_sessions: int) -> None:
    """A server process: serve the echo env the ``kind`` way until killed."""
    import logging

    import uvicorn

    import envhub
    from envhub.serve.server import ServeSettings, build_app, run, uvicorn_config

    logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL)  # OpenEnv's close noise
    echo = envhub_echo()
    envhub.register(echo.name, echo, override=True)
    settings = ServeSettings(env=echo.name, port=port, max_sessions=max_sessions)
    options: dict[str, Any] = dict(log_level="critical", ws_max_size=16 * 2**20)
    if kind in ("bare_echo", "openenv"):  # served as their own servers are: plain uvicorn
        app = bare_echo_app() if kind == "bare_echo" else openenv_app(max_sessions)
        uvicorn.Server(uvicorn_config(settings, app, **options)).run()
        return
    if kind == "envhub_openenv_protocol":
        from envhub.serve.openenv_protocol import build_openenv_app

        app = build_openenv_app(settings)
    else:
        app = build_app(settings)
    run(settings, app, **options)  # as `envhub serve` runs it


def start_server(kind: str, max_sessions: int) -> tuple[subprocess.Popen[bytes], str]:
    """Start a server process; its process and base URL once it answers."""
    port = free_port()
    command = [sys.executable, __file__, "--serve", kind, str(port), str(max_sessions)]
    process = subprocess.Popen(command)
    health = "/healthz" if kind == "envhub" else "/health"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}{health}")  # any answer (even 404): it is up
            return process, f"http://127.0.0.1:{port}"
        except httpx.TransportError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"the {kind} server did not start")


@dataclass
class Measured:
    """Steps/s, and the CPU that the server and this client process spent per step while the
    clock ran (on a shared, noisy machine the steadier of the two numbers)."""

    rate: float
    cpu_us: float
    server_us: float = math.nan
    """The server's part of ``cpu_us``."""
    client_us: float = math.nan
    """The client process's part of ``cpu_us``."""


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds that process ``pid`` has spent."""
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


async def drive(
    sessions: int, seconds: float, connect: Any, episode: Any, server_pid: int
) -> tuple[Measured, list[Any]]:
    """Open ``sessions`` clients, then run episodes on all of them for ``seconds``; what was
    measured, and the clients."""
    clients = [await connect() for _ in range(sessions)]
    steps = 0
    deadline = time.perf_counter() + seconds

    async def worker(client: Any) -> None:
        nonlocal steps
        while time.perf_counter() < deadline:
            taken = await episode(client)  # not `steps += await ...`: that reads steps first
            steps += taken

    clock = Clock(server_pid)
    await asyncio.gather(*(worker(c) for c in clients))
    return clock.measured(steps), clients


class Clock:
    """Wall time and the server's and this process's CPU, from now."""

    def __init__(self, server_pid: int) -> None:
        self.server_pid = server_pid
        self.started = time.perf_counter()
        self.server, self.client = cpu_seconds(server_pid), time.process_time()

    def measured(self, count: int) -> Measured:
        """Rate and CPU per unit of ``count`` units done since the clock started."""
        elapsed = time.perf_counter() - self.started
        server = 1e6 * (cpu_seconds(self.server_pid) - self.server) / max(count, 1)
        client = 1e6 * (time.process_time() - self.client) / max(count, 1)
        return Measured(count / elapsed, server + client, server, client)


async def envhub_rate(url: str, sessions: int, seconds: float, server_pid: int) -> Measured:
    """``RemoteEnv`` clients over WebSocket."""
    import envhub

    async def connect() -> Any:
        return await asyncio.to_thread(envhub.make, url.replace("http://", "ws://") + "/")

    async def episode(env: Any) -> int:
        await env.areset(seed=0)
        done, steps = False, 0
        while not done:
            _, _, done, _, _ = await env.astep("hello there")
            steps += 1
        return steps

    measured, envs = await drive(sessions, seconds, connect, episode, server_pid)
    for env in envs:
        await asyncio.to_thread(env.close)
    return measured


async def openenv_client_rate(url: str, sessions: int, seconds: float, server_pid: int) -> Measured:
    """OpenEnv's ``GenericEnvClient``s, one WebSocket each."""
    from openenv.core import GenericEnvClient

    async def connect() -> Any:
        return await GenericEnvClient(base_url=url, connect_timeout_s=60).connect()

    async def episode(client: Any) -> int:
        result = await client.reset(seed=0)
        steps = 0
        while True:
            result = await client.step({"message": "hello there"})
            steps += 1
            if result.done:
                return steps

    measured, clients = await drive(sessions, seconds, connect, episode, server_pid)
    await asyncio.gather(*(c.disconnect() for c in clients))
    return measured


async def bare_echo_rate(url: str, seconds: float, server_pid: int) -> Measured:
    """Round trips/s (and CPU per round trip) of one bare ``websockets`` client against the
    bare echo, one in flight."""
    from websockets.asyncio.client import connect

    frame = json.dumps({"id": "0123456789abcdef-1", "op": "step", "session": "s-1", "action": "hi"})
    async with connect(url.replace("http://", "ws://") + "/", compression=None) as ws:
        trips, clock = 0, Clock(server_pid)
        while time.perf_counter() - clock.started < seconds:
            await ws.send(frame)
            await ws.recv()
            trips += 1
        return clock.measured(trips)


def measure(kind: str, sessions: int, seconds: float) -> Measured:
    """Steps/s (and CPU per step) of ``sessions`` clients on a fresh ``kind`` server."""
    process, url = start_server(kind, max(sessions, 1))
    try:
        if kind == "bare_echo":
            return asyncio.run(bare_echo_rate(url, seconds, process.pid))
        rate = envhub_rate if kind == "envhub" else openenv_client_rate
        return asyncio.run(rate(url, sessions, seconds, process.pid))
    finally:
        process.kill()
        process.wait()


def main() -> None:
    """Print the table (and write the JSON with ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 64, 1024])
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--serve", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        kind, port, max_sessions = args.serve
        return run_server(kind, int(port), int(max_sessions))
    kinds = ("envhub", "openenv", "envhub_openenv_protocol")
    print(
        f"{'sessions':>8}  "
        + "  ".join(f"{k:>24}" for k in kinds)
        + "  speedup (server alone), steps/s; CPU us/step envhub vs openenv"
    )
    rows = []
    floor: Measured | None = None
    for n in args.sessions:
        row: dict[str, float] = {"sessions": n}
        for kind in kinds:
            measured = measure(kind, n, args.seconds)
            row[kind], row[f"{kind}_cpu_us"] = measured.rate, measured.cpu_us
            row[f"{kind}_server_us"] = measured.server_us
            row[f"{kind}_client_us"] = measured.client_us
        if floor is None:  # once, beside the first (1-session) row: this machine's speed drifts
            floor = measure("bare_echo", 1, args.seconds)
        row["speedup"] = row["envhub"] / row["openenv"]
        row["server_speedup"] = row["envhub_openenv_protocol"] / row["openenv"]
        rows.append(row)
        cells = "  ".join(f"{row[k]:>24,.0f}" for k in kinds)
        cpu = f"{row['envhub_cpu_us']:.0f} vs {row['openenv_cpu_us']:.0f}"
        print(
            f"{n:>8}  {cells}  {row['speedup']:>6.1f}x  ({row['server_speedup']:.1f}x)  {cpu}",
            flush=True,
        )
    assert floor is not None  # (at least one session count is measured)
    ones = [row for row in rows if row["sessions"] == 1]
    versus = f" = {floor.rate / ones[0]['openenv']:.1f}x OpenEnv's 1-session rate" if ones else ""
    print(f"1-session floor, bare uvicorn + Starlette WebSocket echo: {floor.rate:,.0f}/s{versus}")
    if ones:
        sides = [
            f"{kind} {ones[0][f'{kind}_server_us']:.0f} + {ones[0][f'{kind}_client_us']:.0f}"
            for kind in ("envhub", "openenv")
        ]
        echo = f"bare echo {floor.server_us:.0f} + {floor.client_us:.0f} (per round trip)"
        print(f"1 session, CPU us per step, server + client: {', '.join(sides)}; {echo}")
    if args.json:
        result = {
            "env": f"echo, {TURNS} turns, reward 1 at the end",
            "seconds": args.seconds,
            "cpus": os.cpu_count(),
            "goal": GOAL,
            "echo_floor": floor.rate,
            "echo_floor_server_us": floor.server_us,
            "echo_floor_client_us": floor.client_us,
            "rows": rows,
        }
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
