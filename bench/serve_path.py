"""Where one session's step goes: each stage of ``envhub serve``'s per-step path, timed alone.

At one session a step is a round trip: the client builds and frames a request, the server parses
the frame, reads and checks the request, runs the env's step, encodes and frames the reply, the
client parses it. ``bench/openenv_compare.py`` times the whole trip against OpenEnv's and a bare
WebSocket echo's (the floor); this script splits envhub's own work into those stages, each run in
a loop in this process (no sockets, no event loop, no scheduler: steadier on a shared machine
than a round trip). The framing stages are what the echo floor pays too (the client's with
websockets' protocol; envhub's client frames its own messages where it can). What is left out
is the event loops' and uvicorn's own work between the stages.

    .venv/bin/python bench/serve_path.py [--runs 20000]

Run it from the worktree whose ``envhub`` it should time (``PYTHONPATH=.``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


def per_call_us(work: Callable[[], Any], runs: int) -> float:
    """Microseconds per call of ``work`` (the best of 5 rounds of ``runs // 5`` calls)."""
    rounds = []
    n = max(runs // 5, 1)
    for _ in range(5):
        started = time.perf_counter_ns()
        for _ in range(n):
            work()
        rounds.append((time.perf_counter_ns() - started) / n / 1000)
    return min(rounds)


def stages(runs: int) -> list[tuple[str, float]]:
    """``(stage, us per step)`` of envhub's path."""
    from openenv_compare import envhub_echo
    from websockets.client import ClientProtocol
    from websockets.protocol import State
    from websockets.server import ServerProtocol
    from websockets.uri import parse_uri

    from envhub.serve import protocol as p
    from envhub.serve.client import framing
    from envhub.serve.service import Caller, EnvService
    from envhub.serve.sessions import SessionStore

    limits = p.Limits(max_message_bytes=4 << 20, session_ttl=600.0, request_numbers=True)
    service = EnvService(lambda args: envhub_echo()(), SessionStore(16, 600.0), limits)
    caller = Caller(owner=None)
    env = envhub_echo()()
    client = ClientProtocol(parse_uri("ws://127.0.0.1/"), state=State.OPEN, max_size=None)
    server = ServerProtocol(state=State.OPEN, max_size=None)

    request = p.step_request("0123456789abcdef-1", "s-abcdefghijklmnop", "hello there", 7)
    frame = p.dumps(request)
    client.send_text(frame.encode())
    client_bytes = b"".join(client.data_to_send())
    loop = asyncio.new_event_loop()
    observation, reward, done, truncated, info = loop.run_until_complete(env.astep("hi"))
    reply = p.ok_reply(
        "0123456789abcdef-1",
        p.step_result(p.encode(observation), reward, done, truncated, p.encode(info), None, None),
    )
    reply_text = p.dumps(reply)
    server.send_text(reply_text.encode())
    server_bytes = b"".join(server.data_to_send())

    def client_build() -> None:
        p.dumps(p.step_request("0123456789abcdef-1", "s-abcdefghijklmnop", "hello there", 7))

    own = getattr(framing, "Frames", None)  # the client's own framing, where it has one
    frames = own() if own is not None else None

    def client_frame() -> None:
        if frames is not None:
            frames.text(frame.encode())
            return
        client.send_text(frame.encode())
        client.data_to_send()

    def server_parse_frame() -> None:
        server.receive_data(client_bytes)
        for event in server.events_received():
            event.data.decode()

    def server_read() -> None:
        for payload in service.payloads(frame, caller):
            service.prepare(payload)

    def env_step() -> None:
        coro = env.astep("hello there")
        try:
            coro.send(None)
        except StopIteration:
            pass

    def server_reply() -> None:
        result = p.step_result(
            p.encode(observation), reward, done, truncated, p.encode(info), None, None
        )
        p.dumps(p.ok_reply("0123456789abcdef-1", result))

    def server_frame() -> None:
        server.send_text(reply_text.encode())
        server.data_to_send()

    def client_parse_frame() -> None:
        if frames is not None:
            for _, payload in frames.read(server_bytes):
                payload.decode()
            return
        client.receive_data(server_bytes)
        for event in client.events_received():
            event.data.decode()

    def client_read() -> None:
        import json

        got = json.loads(reply_text)["result"]
        result = p.StepResult.model_validate(got)
        p.decode(result.observation)
        p.decode(result.info)

    measured = [
        ("client: build + JSON-encode the request", client_build),
        ("client: WebSocket frame (masked)", client_frame),
        ("server: parse the frame (websockets)", server_parse_frame),
        ("server: JSON-decode + parse + bound the request", server_read),
        ("server: the env's step (echo)", env_step),
        ("server: encode the result + JSON", server_reply),
        ("server: WebSocket frame", server_frame),
        ("client: parse the frame", client_parse_frame),
        ("client: JSON-decode + read the result", client_read),
    ]
    rows = [(name, per_call_us(work, runs)) for name, work in measured]
    loop.close()
    return rows


def main() -> None:
    """Print each stage's microseconds and the total."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20000)
    args = parser.parse_args()
    rows = stages(args.runs)
    for name, us in rows:
        print(f"{name:<52} {us:>7.2f} us")
    framing = sum(us for name, us in rows if "frame" in name)
    total = sum(us for _, us in rows)
    print(
        f"{'total (framing alone, which the echo floor pays too)':<52} {total:>7.2f} us "
        f"({framing:.2f})"
    )


if __name__ == "__main__":
    main()
