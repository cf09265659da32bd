"""2000 clients at once against a real ``envhub serve`` process: every one gets a session or a
clear refusal, no client sees another's episode, and nothing is left open when they go."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect

import envhub
from envhub.defaults import free_port
from envhub.serve import protocol as p

CLIENTS = 2000
MAX_SESSIONS = 1500


@pytest.fixture(scope="module")
def crowded_server() -> Iterator[int]:
    """``envhub serve calculator`` in its own process (its own core), 1500 sessions at most."""
    port = free_port()
    command = [sys.executable, "-m", "envhub.cli", "serve", "calculator", "--port", str(port)]
    process = subprocess.Popen(
        [*command, "--max-sessions", str(MAX_SESSIONS)],
        stderr=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:
        assert process.poll() is None, "envhub serve exited"
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz")
            break
        except httpx.TransportError:
            assert time.monotonic() < deadline, "envhub serve did not start"
            time.sleep(0.05)
    yield port
    process.send_signal(signal.SIGINT)
    process.wait(timeout=30)


def metrics(port: int) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    pairs = (line.rsplit(" ", 1) for line in text.splitlines())
    return {name.removeprefix("envhub_serve_"): float(value) for name, value in pairs}


async def ask(ws: ClientConnection, request: dict[str, Any]) -> dict[str, Any]:
    await ws.send(json.dumps(request))
    return json.loads(await ws.recv())


async def crowd(port: int) -> tuple[list[dict[str, Any]], list[Any], list[Any]]:
    """Connect every client at once and create a session on each; then reset and step the
    sessions that were made, each with its own seed and action; then all disconnect."""
    url = f"ws://127.0.0.1:{port}/calculator"
    clients = await asyncio.gather(*(connect(url, open_timeout=120) for _ in range(CLIENTS)))
    created = await asyncio.gather(
        *(ask(ws, {"id": f"c{i}", "op": "create"}) for i, ws in enumerate(clients))
    )
    made = [(i, r["result"]["session"]) for i, r in enumerate(created) if r["ok"]]

    async def episode(i: int, session: str) -> tuple[Any, Any]:
        ws = clients[i]
        reset = await ask(ws, {"id": f"r{i}", "op": "reset", "session": session, "seed": i})
        step = await ask(ws, {"id": f"s{i}", "op": "step", "session": session, "action": f"{i}"})
        return reset, step

    episodes = await asyncio.gather(*(episode(i, s) for i, s in made))
    await asyncio.gather(*(ws.close() for ws in clients))
    return created, made, episodes


def test_2000_clients_at_once_get_a_session_or_a_clear_refusal_and_leave_nothing_open(
    crowded_server: int,
) -> None:
    created, made, episodes = asyncio.run(crowd(crowded_server))
    refused = [r for r in created if not r["ok"]]
    assert len(made) == MAX_SESSIONS and len(refused) == CLIENTS - MAX_SESSIONS
    assert {(r["error"]["code"], r["error"]["type"]) for r in refused} == {(503, p.CAPACITY)}
    assert "maximum of 1500 sessions" in refused[0]["error"]["message"]
    assert {r["id"] for r in created} == {f"c{i}" for i in range(CLIENTS)}
    # Each episode is its own: the reset under seed i is the local env's, the step answers i.
    local = envhub.make("calculator")
    for (i, _), (reset, step) in zip(made[::50], episodes[::50], strict=True):
        assert p.decode(reset["result"]["observation"]) == local.reset(seed=i)[0]
        assert (reset["id"], step["id"]) == (f"r{i}", f"s{i}") and step["ok"]
    assert all(step["ok"] and step["result"]["state"]["turn"] == 1 for _, step in episodes)
    answer_texts = [p.decode(step["result"]["state"]["messages"]) for _, step in episodes]
    assert [texts[-1].content for texts in answer_texts] == [f"{i}" for i, _ in made]
    deadline = time.monotonic() + 30
    while (m := metrics(crowded_server))["sessions_open"] or m["connections_open"]:
        assert time.monotonic() < deadline, f"left open: {m}"
        time.sleep(0.1)
    assert m["sessions_created_total"] == MAX_SESSIONS
    # The server still serves.
    remote = envhub.make(f"ws://127.0.0.1:{crowded_server}/calculator")
    assert remote.reset(seed=3)[0] == local.reset(seed=3)[0]
    remote.close()
