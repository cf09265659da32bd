"""The server's routes, spoken to by raw WebSocket and HTTP clients: idempotent request ids,
malformed and oversized frames, auth, metrics, and sessions freed when a client vanishes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

import envhub
from envhub.errors import RemoteEnvError
from envhub.serve.app import CHUNK, TURNS, Connection, Floor
from envhub.types import user

TOKEN = "s3cret-token"
LIMIT = 4096
TOOL_CALL = '<tool_call>{"name": "calculate", "arguments": {"expression": "2*3"}}</tool_call>'


@pytest.fixture(scope="module")
def server(serve: Callable[..., Any]) -> Any:
    return serve("calculator", max_message_bytes=LIMIT)


@pytest.fixture(scope="module")
def locked(serve: Callable[..., Any]) -> Any:
    return serve("calculator", token=TOKEN)


@pytest.fixture
def ws(server: Any) -> Iterator[ClientConnection]:
    with connect(server.url()) as connection:
        yield connection


def call(ws: ClientConnection, frame: dict[str, Any] | str) -> dict[str, Any]:
    ws.send(frame if isinstance(frame, str) else json.dumps(frame))
    return json.loads(ws.recv(timeout=10))


def open_episode(ws: ClientConnection, n: int = 0) -> str:
    session = call(ws, {"id": f"c{n}", "op": "create"})["result"]["session"]
    assert call(ws, {"id": f"r{n}", "op": "reset", "session": session, "seed": 0})["ok"]
    return session


def test_a_retried_step_is_answered_again_without_a_second_step(
    server: Any, ws: ClientConnection
) -> None:
    session = open_episode(ws)
    before = server.metrics()
    step = {"id": "step-1", "op": "step", "session": session, "action": TOOL_CALL}
    first, retry = call(ws, step), call(ws, step)
    assert retry == first
    assert first["result"]["info"] == {"turn": 1}
    after = call(ws, {**step, "id": "step-2", "action": "\\boxed{6}"})
    assert after["result"]["info"]["turn"] == 2  # the retry did not count as a turn
    metrics = server.metrics()
    assert metrics["steps_total"] - before["steps_total"] == 2
    assert metrics["replays_total"] - before["replays_total"] == 1


def test_a_retried_create_opens_one_session(server: Any, ws: ClientConnection) -> None:
    before = server.metrics()["sessions_open"]
    first = call(ws, {"id": "create-1", "op": "create"})
    assert call(ws, {"id": "create-1", "op": "create"}) == first
    assert server.metrics()["sessions_open"] == before + 1


def test_a_retry_over_http_gets_the_stored_answer(server: Any) -> None:
    url = server.url("http")
    session = httpx.post(url, json={"id": "h-c", "op": "create"}).json()["result"]["session"]
    httpx.post(url, json={"id": "h-r", "op": "reset", "session": session, "seed": 1})
    step = {"id": "h-s", "op": "step", "session": session, "action": TOOL_CALL}
    first, retry = httpx.post(url, json=step), httpx.post(url, json=step)
    assert first.status_code == retry.status_code == 200
    assert first.json() == retry.json() and first.json()["result"]["info"] == {"turn": 1}
    httpx.post(url, json={"id": "h-x", "op": "close", "session": session})


@pytest.mark.parametrize(
    "frame, request_id, message",
    [
        ("this is not json", None, "not JSON: Expecting value"),
        ({"id": "m1", "op": "dance"}, "m1", "unknown op 'dance'"),
        ({"id": "m2", "op": "step", "session": "s"}, "m2", "step request: `action`: Field"),
        ({"id": "m3", "op": "reset", "session": "nope"}, "m3", "no session 'nope'"),
    ],
)
def test_a_malformed_frame_gets_an_error_frame_and_the_connection_goes_on(
    ws: ClientConnection, frame: Any, request_id: str | None, message: str
) -> None:
    reply = call(ws, frame)
    assert reply["id"] == request_id and reply["ok"] is False
    assert message in reply["error"]["message"]
    assert reply["error"]["code"] == (404 if request_id == "m3" else 400)
    assert call(ws, {"id": "after", "op": "create"})["ok"] is True


def test_an_oversized_frame_gets_413_and_the_server_keeps_serving(
    server: Any, ws: ClientConnection
) -> None:
    session = open_episode(ws)
    big = {"id": "big", "op": "step", "session": session, "action": "x" * LIMIT}
    reply = call(ws, big)
    assert reply["ok"] is False and reply["error"]["code"] == 413
    assert f"limit of {LIMIT} bytes" in reply["error"]["message"]
    step = {"id": "small", "op": "step", "session": session, "action": TOOL_CALL}
    assert call(ws, step)["result"]["info"] == {"turn": 1}  # the big one never reached the env
    response = httpx.post(server.url("http"), content=b"x" * (LIMIT + 1))
    assert response.status_code == 413 and response.json()["error"]["type"] == "too_large"


def test_the_client_refuses_to_send_an_oversized_action(server: Any) -> None:
    remote = envhub.make(server.url())
    remote.reset(seed=0)
    with pytest.raises(RemoteEnvError, match=f"accepts at most {LIMIT} .*--max-message-bytes"):
        remote.step("x" * LIMIT)
    assert remote.step(TOOL_CALL)[4] == {"turn": 1}
    remote.close()


def test_a_client_that_vanishes_mid_episode_frees_its_sessions(server: Any) -> None:
    server.wait_for("sessions_open", 0)  # the other tests' clients have gone
    with connect(server.url()) as connection:
        sessions = [open_episode(connection, n) for n in range(3)]
        call(connection, {"id": "s", "op": "step", "session": sessions[0], "action": TOOL_CALL})
        assert server.metrics()["sessions_open"] == 3
    server.wait_for("sessions_open", 0)


def test_wrong_or_missing_tokens_get_401(locked: Any) -> None:
    create = {"id": "a", "op": "create"}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        response = httpx.post(locked.url("http"), json=create, headers=headers)
        assert response.status_code == 401
        assert "missing or wrong bearer token" in response.json()["error"]["message"]
        with pytest.raises(InvalidStatus) as denied:
            connect(locked.url(), additional_headers=headers)
        assert denied.value.response.status_code == 401
    good = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.post(locked.url("http"), json=create, headers=good).json()["ok"] is True


@pytest.mark.parametrize("scheme", ["ws", "http"])
def test_the_client_says_the_token_was_refused_and_takes_it_from_the_environment(
    locked: Any, scheme: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ENVHUB_SERVE_TOKEN", raising=False)
    with pytest.raises(RemoteEnvError, match="refused the token: missing or wrong bearer"):
        envhub.make(locked.url(scheme))
    with pytest.raises(RemoteEnvError, match="refused the token"):
        envhub.make(locked.url(scheme), token="wrong")
    assert envhub.make(locked.url(scheme), token=TOKEN).name == "calculator"
    monkeypatch.setenv("ENVHUB_SERVE_TOKEN", TOKEN)
    assert envhub.make(locked.url(scheme)).name == "calculator"


def test_healthz_and_metrics_need_no_token(locked: Any) -> None:
    base = f"http://127.0.0.1:{locked.port}"
    assert httpx.get(f"{base}/healthz").json() == {"status": "ok", "env": "calculator"}
    metrics = locked.metrics()
    assert metrics["errors_total"] >= 1 and set(metrics) >= {
        "sessions_open",
        "requests_total",
        "errors_total",
        "steps_total",
    }


def test_a_client_that_asks_for_batches_sends_and_gets_arrays(server: Any) -> None:
    with connect(server.url(), additional_headers={"envhub-batch": "1"}) as ws:
        assert ws.response.headers["envhub-batch"] == str(LIMIT)  # the largest batch it reads
        creates = [{"id": f"b{i}", "op": "create"} for i in range(3)]
        ws.send(json.dumps(creates))
        replies: list[dict[str, Any]] = []
        while len(replies) < 3:
            frame = json.loads(ws.recv(timeout=10))
            replies += frame if isinstance(frame, list) else [frame]
        assert sorted(r["id"] for r in replies) == ["b0", "b1", "b2"]
        assert all(r["ok"] for r in replies)
        sessions = [r["result"]["session"] for r in replies]
        resets = [{"id": f"r{i}", "op": "reset", "session": s} for i, s in enumerate(sessions)]
        ws.send(json.dumps([*resets, {"id": "bad", "op": "dance"}]))
        replies = []
        while len(replies) < 4:
            frame = json.loads(ws.recv(timeout=10))
            replies += frame if isinstance(frame, list) else [frame]
        by_id = {r["id"]: r for r in replies}
        assert [by_id[f"r{i}"]["ok"] for i in range(3)] == [True] * 3
        assert "unknown op 'dance'" in by_id["bad"]["error"]["message"]


def test_a_client_that_did_not_ask_gets_no_batches(ws: ClientConnection) -> None:
    assert "envhub-batch" not in ws.response.headers
    reply = call(ws, json.dumps([{"id": "x", "op": "create"}]))
    assert reply["id"] is None and "a frame must be a JSON object" in reply["error"]["message"]


class AsyncEcho(envhub.Env):
    """Natively async and never waits: its requests finish in the loop iteration they start."""

    name = "test-async-echo"

    async def areset(self, *, seed: Any = None, options: Any = None) -> Any:
        return [user("go")], {}

    async def astep(self, action: Any) -> Any:
        return [user(str(action))], 0.5, False, False, {}


def open_async_echo_sessions(ws: ClientConnection, n: int) -> list[str]:
    """``n`` new sessions (request ids unique to the call: a create id seen before is replayed)."""
    ws.send(json.dumps([{"id": f"c{n}-{i}", "op": "create"} for i in range(n)]))
    created: list[dict[str, Any]] = []
    while len(created) < n:
        frame = json.loads(ws.recv(timeout=10))
        created += frame if isinstance(frame, list) else [frame]
    by_id = {r["id"]: r["result"]["session"] for r in created}
    return [by_id[f"c{n}-{i}"] for i in range(n)]


def step_all(ws: ClientConnection, sessions: list[str]) -> list[Any]:
    """Step every session in one frame; the reply frames, as they came."""
    steps = [
        {"id": f"s{i}", "op": "step", "session": s, "action": f"a{i}"}
        for i, s in enumerate(sessions)
    ]
    ws.send(json.dumps(steps))
    frames: list[Any] = []
    while sum(len(f) if isinstance(f, list) else 1 for f in frames) < len(sessions):
        frames.append(json.loads(ws.recv(timeout=10)))
    return frames


def test_the_first_reply_leaves_at_once_and_the_ones_finishing_with_it_in_one_array(
    serve: Callable[..., Any],
) -> None:
    envhub.register(AsyncEcho.name, AsyncEcho, override=True)
    server = serve(AsyncEcho.name)
    with connect(server.url(), additional_headers={"envhub-batch": "1"}) as ws:
        frames = step_all(ws, open_async_echo_sessions(ws, 6))
        # The six steps run in one iteration: the first reply is sent by its own task, the
        # other five are gathered by the writer into one frame.
        assert [len(f) if isinstance(f, list) else "one" for f in frames] == ["one", 5]
        replies = {r["id"]: r["result"] for r in [frames[0], *frames[1]]}
        assert sorted(replies) == [f"s{i}" for i in range(6)]
        assert all(
            replies[f"s{i}"]["observation"][0]["value"]["content"] == f"a{i}" for i in range(6)
        )
        assert {r["reward"] for r in replies.values()} == {0.5}
        # Beyond CHUNK replies finishing together, each full frame leaves as soon as it is full.
        frames = step_all(ws, open_async_echo_sessions(ws, 70))
        assert [len(f) if isinstance(f, list) else "one" for f in frames] == ["one", CHUNK, 5]
        ids = [r["id"] for f in frames for r in (f if isinstance(f, list) else [f])]
        assert sorted(ids) == sorted(f"s{i}" for i in range(70))


def test_while_connections_contend_a_batch_takes_turns_and_alone_it_does_not(
    serve: Callable[..., Any],
) -> None:
    envhub.register(AsyncEcho.name, AsyncEcho, override=True)
    server = serve(AsyncEcho.name)
    with (
        connect(server.url(), additional_headers={"envhub-batch": "1"}) as ws,
        connect(server.url()) as other,
    ):
        sessions = open_async_echo_sessions(ws, 3 * TURNS)
        # Alone, the whole batch runs in one loop iteration: one reply at once, the rest in
        # full frames.
        assert [len(f) if isinstance(f, list) else "one" for f in step_all(ws, sessions)] == [
            "one",
            CHUNK,
            3 * TURNS - 1 - CHUNK,
        ]
        # Another connection speaks: the batch now runs TURNS steps an iteration, its replies
        # leaving in a frame per iteration, while the other connection's request is answered.
        open_episode_on(other)
        frames = step_all(ws, sessions)
        sizes = [len(f) if isinstance(f, list) else 1 for f in frames]
        assert sum(sizes) == 3 * TURNS and max(sizes) <= TURNS and len(sizes) >= 3


def open_episode_on(ws: ClientConnection) -> None:
    session = call(ws, {"id": "other-c", "op": "create"})["result"]["session"]
    assert call(ws, {"id": "other-r", "op": "reset", "session": session})["ok"]


def test_a_connections_requests_past_its_turns_wait_for_the_next_iterations() -> None:
    async def scenario() -> None:
        floor = Floor()
        mine, other = Connection(None, 8, floor), Connection(None, 8, floor)
        mine.heard()
        other.heard()
        assert not mine.contended()  # one connection after another: not yet
        mine.heard()  # two connections in turn, each having spoken: they contend
        assert mine.contended()
        turns = [mine.turn() for _ in range(TURNS + 5)]
        assert turns[:TURNS] == [None] * TURNS  # these run now
        waiting = turns[TURNS:]
        assert not any(w.done() for w in waiting)
        await asyncio.sleep(0)  # the next iteration: the five waiting get their turns first
        assert all(w.done() for w in waiting)
        assert mine.turns_left == TURNS - 5

    asyncio.run(scenario())


def test_a_connection_alone_runs_every_request_at_once() -> None:
    async def scenario() -> None:
        floor = Floor()
        mine, opener = Connection(None, 8, floor), Connection(None, 8, floor)
        opener.heard()  # (as RemoteEnv opens sessions over one connection, runs them on another)
        mine.heard()
        mine.heard()
        assert not mine.contended()
        assert [mine.turn() for _ in range(3 * TURNS)] == [None] * (3 * TURNS)

    asyncio.run(scenario())


class Counter(envhub.Env):
    """Natively async; each step's info says which step of the episode it was."""

    name = "test-counter"

    async def areset(self, *, seed: Any = None, options: Any = None) -> Any:
        self.turn = 0
        return [user("go")], {}

    async def astep(self, action: Any) -> Any:
        self.turn += 1
        return [user(str(action))], 0.0, False, False, {"turn": self.turn}


def test_requests_sent_back_to_back_run_in_the_order_sent(serve: Callable[..., Any]) -> None:
    envhub.register(Counter.name, Counter, override=True)
    server = serve(Counter.name)
    with connect(server.url()) as ws:
        session = open_counter_episode(ws)
        for round_ in range(3):  # the first frame of a burst may be started where it arrives
            for n in range(20):
                frame = {"id": f"{round_}-{n}", "op": "step", "session": session, "action": n}
                ws.send(json.dumps(frame))
            replies = [json.loads(ws.recv(timeout=10)) for _ in range(20)]
            turns = {r["id"]: r["result"]["info"]["turn"] for r in replies}
            assert [turns[f"{round_}-{n}"] for n in range(20)] == [
                20 * round_ + n + 1 for n in range(20)
            ]


def open_counter_episode(ws: ClientConnection) -> str:
    session = call(ws, {"id": "counter-c", "op": "create"})["result"]["session"]
    assert call(ws, {"id": "counter-r", "op": "reset", "session": session})["ok"]
    return session
