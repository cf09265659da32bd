"""A server under hostile clients (issue 40): over-bound values, malformed frames, big batches,
late retries, idle and half-sent connections. Each test asserts the exact refusal and that a good
client on the same server (and, for a malformed frame, another session on the same connection)
goes on with correct answers."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

import envhub
from envhub import registry
from envhub.types import user

ORDER: list[str] = []
"""``group:turn`` of every step, as the steps finished (all servers of this module)."""


class Probe(envhub.Env):
    """Says what it was given; steps of a ``group`` are counted while they run."""

    name = "test-hostile-probe"
    running: dict[str, int] = {}
    peak: dict[str, int] = {}

    def __init__(self, payload: Any = None, delay: float = 0.0, group: str = "good") -> None:
        super().__init__()
        self.payload, self.delay, self.group, self.turn = payload, delay, group, 0

    async def areset(self, *, seed: Any = None, options: Any = None) -> Any:
        self.turn = 0
        return [user(f"seed {seed}")], {
            "options": describe(options),
            "args": describe(self.payload),
        }

    async def astep(self, action: Any) -> Any:
        running = Probe.running[self.group] = Probe.running.get(self.group, 0) + 1
        Probe.peak[self.group] = max(Probe.peak.get(self.group, 0), running)
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
            self.turn += 1
            ORDER.append(f"{self.group}:{self.turn}")
            return [user(f"echo {describe(action)}")], 1.0, False, False, {"turn": self.turn}
        finally:
            Probe.running[self.group] -= 1


def describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"ndarray {value.dtype} {value.shape}"
    return repr(value)[:60]


@pytest.fixture(scope="module", autouse=True)
def probe_env() -> Iterator[None]:
    """The probe env, registered for this module only (registered at import, it was listed by
    every test of the session that lists envs)."""
    envhub.register(Probe.name, Probe, override=True)
    yield
    registry._registered.pop(Probe.name, None)


LIMITS = dict(max_message_bytes=512 * 1024, max_depth=8, max_items=1000, max_array_bytes=8192)


@pytest.fixture(scope="module")
def server(serve: Callable[..., Any]) -> Any:
    return serve(Probe.name, **LIMITS)


@pytest.fixture
def ws(server: Any) -> Iterator[ClientConnection]:
    with connect(server.url()) as connection:
        yield connection


def call(ws: ClientConnection, frame: dict[str, Any] | str | bytes) -> dict[str, Any]:
    ws.send(frame if isinstance(frame, str | bytes) else json.dumps(frame))
    return json.loads(ws.recv(timeout=10))


def open_session(ws: ClientConnection, tag: str, **env_args: Any) -> str:
    created = call(ws, {"id": f"c-{tag}", "op": "create", "env_args": env_args})
    session = created["result"]["session"]
    assert call(ws, {"id": f"r-{tag}", "op": "reset", "session": session, "seed": 0})["ok"]
    return session


def good_client_steps(server: Any, n: int = 2) -> None:
    """A RemoteEnv on its own connection runs an episode and gets exact answers."""
    with envhub.make(server.url()) as good:
        good_steps(good, n)


def good_steps(good: envhub.Env, n: int) -> None:
    """Reset ``good`` and step it ``n`` times, checking every answer."""
    observation, info = good.reset(seed=3)
    assert observation == [user("seed 3")] and info == {"options": "None", "args": "None"}
    for turn in range(1, n + 1):
        observation, reward, done, cut, info = good.step(f"hello {turn}")
        assert (observation, reward, done, cut, info) == (
            [user(f"echo 'hello {turn}'")],
            1.0,
            False,
            False,
            {"turn": turn},
        )


def error_of(reply: dict[str, Any]) -> tuple[Any, int, str, str]:
    assert reply["ok"] is False
    error = reply["error"]
    return reply["id"], error["code"], error["type"], error["message"]


# -- 1. values bounded before they are built ----------------------------------------------------


def ndarray(dtype: str, value: Any) -> dict[str, Any]:
    return {"$envhub": "ndarray", "dtype": dtype, "value": value}


@pytest.mark.parametrize(
    "op, field, value, code, message",
    [
        (
            "step",
            "action",
            ndarray("V268435456", [0]),  # ~130 bytes asking for 256 MB
            400,
            "`action`: dtype 'V268435456' is not carried; arrays of bool, int, float, complex, "
            "str or bytes are",
        ),
        (
            "step",
            "action",
            ndarray("U1048576", ["x"]),
            413,
            "`action` holds arrays of 4194304 bytes (this one: 1 x <U1048576 elements); at most "
            "8192 (envhub serve --max-array-bytes)",
        ),
        (
            "reset",
            "options",
            {"rows": list(range(1001))},
            413,
            "`options` holds more than 1000 items (envhub serve --max-items)",
        ),
        (
            "reset",
            "options",
            {"a": [[[[[[[[["deep"]]]]]]]]]},
            413,
            "`options` holds nesting deeper than 8 levels (envhub serve --max-depth)",
        ),
        (
            "create",
            "env_args",
            {"payload": ndarray("complex128", [0.0] * 513)},
            413,
            "`env_args` holds arrays of 8208 bytes (this one: 513 x complex128 elements); at most "
            "8192 (envhub serve --max-array-bytes)",
        ),
    ],
)
def test_an_over_bound_value_is_refused_on_its_id_and_the_server_serves_on(
    server: Any, ws: ClientConnection, op: str, field: str, value: Any, code: int, message: str
) -> None:
    other = open_session(ws, "other")
    target = open_session(ws, "target")
    frame = {"id": "hostile", "op": op, field: value}
    if op != "create":
        frame["session"] = target
    assert error_of(call(ws, frame)) == (
        "hostile",
        code,
        "too_large" if code == 413 else "bad_request",
        message,
    )
    good_client_steps(server)
    step = call(ws, {"id": "after", "op": "step", "session": other, "action": "still here"})
    assert step["result"]["observation"][0]["value"]["content"] == "echo 'still here'"


def test_values_at_the_bounds_reach_the_env(server: Any, ws: ClientConnection) -> None:
    created = call(
        ws,
        {"id": "c", "op": "create", "env_args": {"payload": ndarray("complex128", [0.5] * 512)}},
    )
    session = created["result"]["session"]
    reset = call(ws, {"id": "r", "op": "reset", "session": session, "options": {"rows": [0] * 998}})
    assert reset["result"]["info"] == {
        "options": repr({"rows": [0] * 998})[:60],
        "args": "ndarray complex128 (512,)",
    }
    step = call(ws, {"id": "s", "op": "step", "session": session, "action": [[[[[[["x"]]]]]]]})
    assert step["result"]["observation"][0]["value"]["content"] == "echo [[[[[[['x']]]]]]]"


# -- 3. malformed frames: an error on their own id, the connection goes on ------------------------


def malformed_frames(session: str) -> list[tuple[str | bytes, Any, int, str]]:
    """``(frame, reply id, code, message)``: what each malformed frame is answered."""
    head = f'{{"id": "m", "op": "step", "session": "{session}", "action": '
    utf8 = head.encode() + b'"\xff"}'
    cut = head + '"x"'
    return [
        (
            head + "[" * 50_000 + "]" * 50_000 + "}",
            "m",
            400,
            "not readable: the JSON nests deeper than the server's parser goes",
        ),
        (
            head + "1" * 5000 + "}",
            "m",
            400,
            "not readable: Exceeds the limit (4300 digits) for integer string conversion: value "
            "has 5000 digits",
        ),
        (utf8, "m", 400, f"not UTF-8 (byte {len(head.encode()) + 1}: invalid start byte)"),
        (
            head + '"x", "seq": "one"}',
            "m",
            400,
            "step request: `seq`: Input should be a valid integer, unable to parse string as an "
            "integer",
        ),
        (
            '{"id": 7, "op": "step"}',
            None,
            400,
            "step request: `id`: Input should be a valid string (and 2 more)",
        ),
        ("[1, 2]", None, 400, "a frame must be a JSON object"),
        (
            cut,
            "m",
            400,
            f"not JSON: Expecting ',' delimiter: line 1 column {len(cut) + 1} (char {len(cut)})",
        ),
    ]


def test_a_malformed_frame_is_answered_and_the_connections_other_sessions_go_on(
    server: Any, ws: ClientConnection
) -> None:
    other = open_session(ws, "other")
    target = open_session(ws, "target")
    for n, (frame, request_id, code, message) in enumerate(malformed_frames(target), 1):
        got = error_of(call(ws, frame))
        assert got[:3] == (request_id, code, "too_large" if code == 413 else "bad_request")
        assert got[3] == message
        step = call(ws, {"id": f"o{n}", "op": "step", "session": other, "action": f"on {n}"})
        assert step["result"]["info"] == {"turn": n}
    good_client_steps(server)
    # The target session was never stepped by any of them.
    step = call(ws, {"id": "t", "op": "step", "session": target, "action": "first"})
    assert step["result"]["info"] == {"turn": 1}


def test_over_http_a_malformed_body_gets_a_json_error_not_a_500(
    server: Any, ws: ClientConnection
) -> None:
    target = open_session(ws, "target")
    for frame, request_id, code, message in malformed_frames(target):
        response = httpx.post(server.url("http"), content=frame)
        assert response.status_code == code
        assert response.headers["content-type"] == "application/json"
        assert error_of(response.json())[:2] == (request_id, code)
        assert error_of(response.json())[3] == message
    good_client_steps(server)


# -- 2. batches under the in-flight limit --------------------------------------------------------


def test_a_big_batch_waits_for_room_and_does_not_hold_up_other_clients(
    serve: Callable[..., Any],
) -> None:
    server = serve(Probe.name, max_in_flight=4)
    good = envhub.make(server.url())  # connected before the batch comes
    with connect(server.url(), additional_headers={"envhub-batch": "1"}) as ws:
        n = 100
        ws.send(
            json.dumps(
                [
                    {"id": f"c{i}", "op": "create", "env_args": {"delay": 0.05, "group": "batch"}}
                    for i in range(n)
                ]
            )
        )
        sessions = {r["id"]: r["result"]["session"] for r in replies(ws, n)}
        ORDER.clear()
        ws.send(
            json.dumps(
                [
                    {"id": f"s{i}", "op": "step", "session": sessions[f"c{i}"], "action": i}
                    for i in range(n)
                ]
            )
        )
        good_steps(good, 3)  # on its own connection, while the batch runs
        answers = replies(ws, n)
    good.close()
    assert sorted(r["id"] for r in answers if r["ok"]) == sorted(f"s{i}" for i in range(n))
    assert Probe.peak["batch"] == 4  # back-pressure: never more than the limit at once
    # The good client's three steps finished while the batch was still running.
    assert ORDER.index("good:3") < len(ORDER) - 1 and ORDER[-1] == "batch:1"


def replies(ws: ClientConnection, n: int) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    while len(got) < n:
        frame = json.loads(ws.recv(timeout=30))
        got += frame if isinstance(frame, list) else [frame]
    return got


# -- 4. retries: recognised after any number of newer requests -----------------------------------


def test_a_retry_older_than_the_answer_cache_is_refused_not_run_again(
    server: Any, ws: ClientConnection
) -> None:
    session = open_session(ws, "retry")
    first = {"id": "first", "op": "step", "session": session, "seq": 2, "action": "one"}
    assert call(ws, first)["result"]["info"] == {"turn": 1}
    before = server.metrics()
    for seq in range(3, 23):
        step = {"id": f"n{seq}", "op": "step", "session": session, "seq": seq, "action": "x"}
        assert call(ws, step)["result"]["info"] == {"turn": seq - 1}
    assert error_of(call(ws, first)) == (
        "first",
        409,
        "stale_retry",
        f"request 'first' (seq 2) of session {session} was started before and its answer is "
        "no longer kept (the session is at seq 22); it was not run again",
    )
    # The same number under a new id is no new request either.
    assert error_of(call(ws, {**first, "id": "again"}))[1:3] == (409, "stale_retry")
    # A retry whose answer is still kept gets that answer.
    last = {"id": "n22", "op": "step", "session": session, "seq": 22, "action": "x"}
    assert call(ws, last)["result"]["info"] == {"turn": 21}
    assert server.metrics()["steps_total"] - before["steps_total"] == 20
    # Numbers may arrive out of order (a session's requests can come over two connections).
    late = {"id": "n30", "op": "step", "session": session, "seq": 30, "action": "x"}
    assert call(ws, late)["result"]["info"] == {"turn": 22}
    early = {"id": "n25", "op": "step", "session": session, "seq": 25, "action": "x"}
    assert call(ws, early)["result"]["info"] == {"turn": 23}
    good_client_steps(server)


# -- 5. idle and half-sent connections -----------------------------------------------------------


@pytest.fixture(scope="module")
def slow_readers(serve: Callable[..., Any]) -> Any:
    """Half-sent requests are cut after 0.5 s (idle connections only after 30 s)."""
    return serve(Probe.name, read_timeout=0.5, idle_timeout=30)


@pytest.fixture(scope="module")
def idlers(serve: Callable[..., Any]) -> Any:
    """Idle WebSocket connections are closed after 0.5 s."""
    return serve(Probe.name, idle_timeout=0.5)


def raw_socket(server: Any) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.settimeout(20)  # a hang guard only: the server closes it well before
    return sock


def until_closed(sock: socket.socket) -> bytes:
    """What the server sends until it closes the connection."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    return data


def websocket_handshake(sock: socket.socket, server: Any) -> None:
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        f"GET /{server.settings.env} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(4096)
    assert head.startswith(b"HTTP/1.1 101")


POST = f"POST /{Probe.name} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()


@pytest.mark.parametrize(
    "half_sent",
    [
        POST + b"Content-Le",  # the headers stop
        POST + b'Content-Length: 100\r\n\r\n{"id": ',  # the body stops
        b"",  # connects and sends nothing
    ],
    ids=["headers", "body", "nothing"],
)
def test_a_half_sent_http_request_is_cut_off(slow_readers: Any, half_sent: bytes) -> None:
    sock = raw_socket(slow_readers)
    sock.sendall(half_sent)
    good_client_steps(slow_readers)  # served while the half-sent request hangs
    assert until_closed(sock) == b""


def test_a_half_sent_websocket_frame_is_cut_off(slow_readers: Any) -> None:
    sock = raw_socket(slow_readers)
    websocket_handshake(sock, slow_readers)
    mask = os.urandom(4)
    # A text frame announcing 1000 bytes, of which 10 come.
    sock.sendall(bytes([0x81, 0x80 | 126]) + (1000).to_bytes(2, "big") + mask + b"x" * 10)
    good_client_steps(slow_readers)
    assert until_closed(sock) == b""  # cut by the frame deadline, not closed as idle (1001)


def test_an_idle_websocket_connection_is_closed_but_a_long_step_is_not_idle(idlers: Any) -> None:
    with connect(idlers.url()) as ws:
        with pytest.raises(ConnectionClosed) as caught:
            ws.recv(timeout=20)
        assert (caught.value.rcvd.code, caught.value.rcvd.reason) == (
            1001,
            "idle for more than 0.5 s",
        )
    with envhub.make(idlers.url(), delay=2.0) as slow:  # a step of 4x the idle timeout
        slow.reset(seed=0)
        observation, _, _, _, info = slow.step("take your time")
        assert observation == [user("echo 'take your time'")] and info == {"turn": 1}
    good_client_steps(idlers)
