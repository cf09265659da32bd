"""The client transport's one-timer time-outs (``Deadlines``), on a real event loop, the HTTP
transport's proxy, read from the environment once, and the WebSocket client's own framing
(``Frames``) against websockets' real protocol."""

from __future__ import annotations

import asyncio

import pytest
from websockets.client import ClientProtocol
from websockets.frames import Opcode
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.uri import parse_uri

from envhub.serve.client.deadlines import TIMED_OUT, Deadlines
from envhub.serve.client.framing import CONTROL, REST, TEXT, Frames
from envhub.serve.client.http_transport import env_proxy


def test_each_watched_request_times_out_after_its_own_timeout_and_no_sooner() -> None:
    async def scenario() -> dict[str, float | str]:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines()
        short, long, answered = loop.create_future(), loop.create_future(), loop.create_future()
        start = loop.time()
        deadlines.watch(long, 0.6, loop)
        deadlines.watch(answered, 0.2, loop)
        deadlines.watch(short, 0.2, loop)  # shorter than the running tick: the timer re-arms
        answered.set_result("reply")
        deadlines.forget(answered)
        seen: dict[str, float | str] = {}
        await short
        seen["short"] = loop.time() - start
        await long
        seen["long"] = loop.time() - start
        seen["answered"] = answered.result()
        await asyncio.sleep(0.3)  # one more tick: nothing is watched, the timer stops
        seen["timer_after"] = "armed" if deadlines._timer is not None else "stopped"
        assert short.result() is TIMED_OUT and long.result() is TIMED_OUT
        return seen

    seen = asyncio.run(scenario())
    assert 0.2 <= seen["short"] < 0.2 + 0.3  # noticed within a tick (0.05 s), with slack
    assert 0.6 <= seen["long"] < 0.6 + 0.3
    assert seen["answered"] == "reply"
    assert seen["timer_after"] == "stopped"


def test_the_http_transport_takes_its_proxy_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert env_proxy("http://envs.example:8000/calculator") is None
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.corp:3128")
    monkeypatch.setenv("HTTPS_PROXY", "http://tls-proxy.corp:3128")
    monkeypatch.setenv("NO_PROXY", "localhost,.internal")
    assert env_proxy("http://envs.example:8000/calculator") == "http://proxy.corp:3128"
    assert env_proxy("https://envs.example/calculator") == "http://tls-proxy.corp:3128"
    assert env_proxy("http://localhost:8000/calculator") is None
    assert env_proxy("http://gpu7.internal:8000/calculator") is None


def server_frames(*texts: str, ping: bool = False) -> bytes:
    """What a real websockets server writes for ``texts`` (a ping after the first)."""
    server = ServerProtocol(state=State.OPEN, max_size=None)
    for n, text in enumerate(texts):
        server.send_text(text.encode())
        if ping and n == 0:
            server.send_ping(b"are you there")
    return b"".join(server.data_to_send())


@pytest.mark.parametrize("chunk", [1, 3, 7, 64, 10**9])
def test_the_client_reads_whole_messages_however_the_bytes_are_cut(chunk: int) -> None:
    texts = ["short", "x" * 200, "é" * 40_000, "y" * 70_000]  # 7-bit, 16-bit and 64-bit lengths
    data = server_frames(*texts, ping=True)
    frames = Frames()
    found = []
    for at in range(0, len(data), chunk):
        found += frames.read(data[at : at + chunk])
    texts_read = [payload.decode() for kind, payload in found if kind == TEXT]
    assert texts_read == texts
    # The ping is given whole, for websockets' protocol to answer.
    [(kind, ping)] = [f for f in found if f[0] != TEXT]
    assert kind == CONTROL
    client = ClientProtocol(parse_uri("ws://x/"), state=State.OPEN)
    client.receive_data(ping)
    [event] = client.events_received()
    assert event.opcode == Opcode.PING and event.data == b"are you there"


def test_a_fragmented_message_hands_the_rest_to_websockets() -> None:
    server = ServerProtocol(state=State.OPEN, max_size=None)
    server.send_text(b"whole")
    server.send_text(b"part one, ", fin=False)
    server.send_continuation(b"part two", fin=True)
    found = Frames().read(b"".join(server.data_to_send()))
    assert [kind for kind, _ in found] == [TEXT, REST]
    client = ClientProtocol(parse_uri("ws://x/"), state=State.OPEN)
    client.receive_data(found[1][1])
    assert [e.data for e in client.events_received()] == [b"part one, ", b"part two"]


def test_the_clients_frames_are_masked_and_read_by_a_real_server() -> None:
    frames = Frames()
    texts = ["step", "z" * 300, "w" * 70_000]
    written = [frames.text(text.encode()) for text in texts]
    server = ServerProtocol(state=State.OPEN, max_size=None)
    for frame in written:
        server.receive_data(frame)
    assert [e.data.decode() for e in server.events_received()] == texts
    keys = {frame[-len(text) - 4 : -len(text)] for frame, text in zip(written, texts, strict=True)}
    assert len(keys) == 3  # a random key per frame
