"""A soak of ``envhub serve`` under mixed good and hostile clients (issue 40).

One server process serves a trivial async echo env (8 turns, ``bench/openenv_compare.py``'s)
with its default limits. For ``--minutes`` (default 10):

- **good clients** (``--good``, default 8) in this process: ``RemoteEnv`` over WebSocket, each
  running episodes (reset, 8 steps) with ``--think`` ms between steps, every answer checked;
  the latency of each step is recorded;
- **bad clients** in a process of their own, each attack in a loop, as fast as the server
  answers it: step actions declaring huge numpy arrays (a ~130-byte frame asking for 256 MB),
  values over the item and depth bounds, malformed frames (nesting 50,000 deep, numbers of
  5,000 digits, invalid UTF-8, wrong types, not JSON), frames over the size limit, batches of
  2,000 steps on 200 sessions, retries of requests long answered, the same malformed bodies over
  HTTP, connections that open sessions and vanish mid-episode, and slow clients that send half
  a frame or half an HTTP request and stall (the server cuts them after its read timeout).

Every ``--every`` seconds a row: the good clients' steps, p50/p99/max step latency (ms), the
bad requests answered (and how many got the expected error), and the server's RSS (MB),
sampled every second (the row shows the window's max). At the end the whole run's good p50/p99
and the RSS range after the first window, against the goals (good p99 < 50 ms; RSS bounded).

    .venv/bin/python bench/serve_soak.py [--minutes 10] [--good 8] [--think 10] [--every 30]
        [--attacks frames batches retries http vanish slow] [--max-in-flight N] [--pin]
        [--json out.json]

``--attacks`` with no name runs the good clients alone (the latency floor of this machine);
``--pin`` puts the server alone on one core and every client on the other (Linux), to tell the
server's share of a latency from the clients' competing for its core. The last lines give each
process's CPU over the run.

A connection may have ``--max-in-flight`` (1024) requests running (the limit must stay high for
one client's many slow sessions: 1024 concurrent episodes of a slow env over one connection need
1024 in flight); while connections contend, the server runs at most ``TURNS`` of one
connection's requests a loop iteration and makes a connection that sent a big frame wait
``PACE`` times what reading it cost (``envhub/serve/app.py``), so that a good request waits for
iterations of bounded length. On a shared 2-core machine what is left of the good clients'
p99 is mostly the scheduler's: compare a run with ``--attacks`` alone and one with ``--pin``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from envhub.defaults import free_port

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

P99_GOAL_MS = 50.0


# -- the server --------------------------------------------------------------------------------


def run_server(port: int, max_in_flight: int) -> None:
    """The server process: ``envhub serve`` of the echo env with default limits (but
    ``max_in_flight``)."""
    import logging

    from openenv_compare import envhub_echo

    import envhub
    from envhub.serve.server import ServeSettings, build_app, run

    logging.getLogger("envhub").setLevel(logging.ERROR)  # the attacks are expected
    echo = envhub_echo()
    envhub.register(echo.name, echo, override=True)
    settings = ServeSettings(
        env=echo.name, port=port, max_sessions=4096, max_in_flight=max_in_flight
    )
    run(settings, build_app(settings), log_level="critical")


def start_server(max_in_flight: int) -> tuple[subprocess.Popen[bytes], int]:
    """Start the server process; its process and port once it answers."""
    port = free_port()
    command = [sys.executable, __file__, "--serve", str(port), str(max_in_flight)]
    process = subprocess.Popen(command)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz")
            return process, port
        except httpx.TransportError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("the server did not start")


# -- good clients --------------------------------------------------------------------------------


async def good_client(url: str, until: float, think: float, latencies: list[tuple[float, float]]):
    """Episodes until ``until``; each step's (finish time, seconds) appended to ``latencies``."""
    import envhub
    from envhub.types import user

    env = await asyncio.to_thread(envhub.make, url)
    try:
        while time.perf_counter() < until:
            await env.areset(seed=0)
            done, turn = False, 0
            while not done and time.perf_counter() < until:
                turn += 1
                started = time.perf_counter()
                observation, reward, done, _, info = await env.astep(f"turn {turn}")
                finished = time.perf_counter()
                if observation != [user(f"turn {turn}")] or info != {"turn": turn}:
                    raise AssertionError(f"a good client got a wrong answer: {observation} {info}")
                latencies.append((finished, finished - started))
                await asyncio.sleep(think)
    finally:
        await asyncio.to_thread(env.close)


# -- bad clients ---------------------------------------------------------------------------------


class Tally:
    """Bad requests answered, and how many got the error expected of them."""

    def __init__(self) -> None:
        self.answered = 0
        self.expected = 0
        self.unexpected: dict[str, int] = {}

    def check(self, reply: dict[str, Any], codes: tuple[int, ...], attack: str) -> None:
        """Count ``reply``: expected if its status (200 when ok) is one of ``codes``."""
        self.answered += 1
        code = 200 if reply.get("ok") else reply.get("error", {}).get("code")
        if code in codes:
            self.expected += 1
        else:
            key = f"{attack}: {code}"
            self.unexpected[key] = self.unexpected.get(key, 0) + 1


async def open_session(ws: Any, tag: str) -> str:
    """A new session on ``ws``, reset; its id."""
    await ws.send(json.dumps({"id": f"c-{tag}", "op": "create"}))
    session = json.loads(await ws.recv())["result"]["session"]
    await ws.send(json.dumps({"id": f"r-{tag}", "op": "reset", "session": session, "seed": 0}))
    await ws.recv()
    return session


def attack_frames(session: str) -> list[tuple[str, str | bytes, tuple[int, ...]]]:
    """``(name, frame, expected codes)`` of the single-frame attacks on ``session``."""
    head = f'{{"id": "bad", "op": "step", "session": "{session}", "action": '
    array = '{"$envhub": "ndarray", "dtype": "V268435456", "value": [0]}'
    return [
        ("huge array", head + array + "}", (400,)),
        (
            "str array",
            head + '{"$envhub": "ndarray", "dtype": "U99999999", "value": ["x"]}}',
            (413,),
        ),
        ("items", head + json.dumps(list(range(200_000))) + "}", (413,)),
        ("depth", head + "[" * 40 + "]" * 40 + "}", (413,)),
        ("deep json", head + "[" * 50_000 + "]" * 50_000 + "}", (400,)),
        ("long number", head + "1" * 5000 + "}", (400,)),
        ("utf-8", head.encode() + b'"\xff\xfe"}', (400,)),
        ("types", '{"id": "bad", "op": "step", "session": 5, "action": []}', (400,)),
        ("not json", head + "nope", (400,)),
        ("oversized", head + '"' + "x" * (5 * 2**20) + '"}', (413,)),
    ]


async def frame_attacker(url: str, until: float, tally: Tally) -> None:
    """Single malformed or over-bound frames, one after another, on one connection."""
    from websockets.asyncio.client import connect

    async with connect(url, max_size=2**24, compression=None) as ws:
        session = await open_session(ws, "frames")
        attacks = attack_frames(session)
        n = 0
        while time.perf_counter() < until:
            name, frame, codes = attacks[n % len(attacks)]
            n += 1
            await ws.send(frame)
            tally.check(json.loads(await ws.recv()), codes, name)


async def batch_attacker(url: str, until: float, tally: Tally) -> None:
    """Batches of 2,000 steps over 200 sessions, one batch after another."""
    from websockets.asyncio.client import connect

    async with connect(url, additional_headers={"envhub-batch": "1"}, compression=None) as ws:
        await ws.send(json.dumps([{"id": f"c{i}", "op": "create"} for i in range(200)]))
        sessions = [r["result"]["session"] for r in await replies(ws, 200)]
        round_ = 0
        while time.perf_counter() < until:
            round_ += 1
            batch = [
                {"id": f"b{round_}-{i}", "op": "step", "session": sessions[i % 200], "action": "x"}
                for i in range(2000)
            ]
            await ws.send(json.dumps(batch))
            for reply in await replies(ws, 2000):
                tally.check(reply, (200, 500), "batch")  # 500: the episode ended (echo's rule)


async def replies(ws: Any, n: int) -> list[dict[str, Any]]:
    """The next ``n`` replies on ``ws``, batched or not."""
    got: list[dict[str, Any]] = []
    while len(got) < n:
        frame = json.loads(await ws.recv())
        got += frame if isinstance(frame, list) else [frame]
    return got


async def retry_attacker(url: str, until: float, tally: Tally) -> None:
    """16 numbered steps, then the first 8 again: their answers have left the cache (409)."""
    from websockets.asyncio.client import connect

    async with connect(url, compression=None) as ws:
        n = 0
        while time.perf_counter() < until:
            n += 1
            session = await open_session(ws, f"retry{n}")
            steps = [
                {"id": f"q{n}-{seq}", "op": "step", "session": session, "seq": seq, "action": "x"}
                for seq in range(2, 18)
            ]
            for step in steps:
                await ws.send(json.dumps(step))
                tally.check(json.loads(await ws.recv()), (200,), "retry: first")
            for step in steps[:8]:
                await ws.send(json.dumps(step))
                tally.check(json.loads(await ws.recv()), (409,), "retry: late")
            await ws.send(json.dumps({"id": f"x{n}", "op": "close", "session": session}))
            await ws.recv()


async def http_attacker(base: str, until: float, tally: Tally) -> None:
    """The frame attacks as HTTP bodies."""
    async with httpx.AsyncClient() as client:
        created = await client.post(base, json={"id": "c-http", "op": "create"})
        session = created.json()["result"]["session"]
        attacks = [a for a in attack_frames(session) if a[0] != "oversized"]
        n = 0
        while time.perf_counter() < until:
            name, frame, codes = attacks[n % len(attacks)]
            n += 1
            response = await client.post(base, content=frame)
            reply = response.json()  # a JSON error, never a plain-text 500
            tally.check(reply, codes, f"http {name}")
            if response.status_code != reply["error"]["code"]:
                tally.check({"ok": False, "error": {"code": response.status_code}}, (), name)


async def vanisher(url: str, until: float, tally: Tally) -> None:
    """Opens a session, steps once, and drops the connection mid-episode."""
    from websockets.asyncio.client import connect

    while time.perf_counter() < until:
        ws = await connect(url, compression=None)
        session = await open_session(ws, "gone")
        await ws.send(json.dumps({"id": "s", "op": "step", "session": session, "action": "x"}))
        tally.check(json.loads(await ws.recv()), (200,), "vanisher")
        ws.transport.abort()
        await asyncio.sleep(0.01)


async def slowloris(port: int, path: str, until: float, tally: Tally, held: int = 32) -> None:
    """Keeps ``held`` connections half-sent (frames and HTTP requests); reopens what is cut."""

    async def one(n: int) -> None:
        while time.perf_counter() < until:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            if n % 2:
                writer.write(
                    f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 999\r\n\r\n{{".encode()
                )
            else:
                key = base64.b64encode(os.urandom(16)).decode()
                handshake = (
                    f"GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                    f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                    "Sec-WebSocket-Version: 13\r\n\r\n"
                )
                writer.write(handshake.encode())
                await reader.readuntil(b"\r\n\r\n")
                writer.write(bytes([0x81, 0xFE]) + (4000).to_bytes(2, "big") + b"mask" + b"x" * 9)
            try:
                while await reader.read(65536):  # until the server cuts it
                    pass
                tally.answered += 1
                tally.expected += 1
            except ConnectionError:
                tally.answered += 1
                tally.expected += 1
            writer.close()

    await asyncio.gather(*(one(n) for n in range(held)))


ATTACKS = ("frames", "batches", "retries", "http", "vanish", "slow")


def run_bad(port: int, env: str, seconds: float, attacks: list[str]) -> None:
    """The bad clients' process: the attacks until ``seconds`` are up; the tally as JSON."""
    url, base = f"ws://127.0.0.1:{port}/{env}", f"http://127.0.0.1:{port}/{env}"
    tally = Tally()

    async def main() -> None:
        until = time.perf_counter() + seconds
        attackers = {
            "frames": lambda: frame_attacker(url, until, tally),
            "batches": lambda: batch_attacker(url, until, tally),
            "retries": lambda: retry_attacker(url, until, tally),
            "http": lambda: http_attacker(base, until, tally),
            "vanish": lambda: vanisher(url, until, tally),
            "slow": lambda: slowloris(port, f"/{env}", until, tally),
        }
        await asyncio.gather(*(attackers[name]() for name in attacks))

    asyncio.run(main())
    print(json.dumps(tally.__dict__), flush=True)


# -- the run -------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds that process ``pid`` has spent."""
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nan when empty)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def soak(args: argparse.Namespace) -> int:
    """Run the soak: server, bad clients' process, good clients here; print the table."""
    from openenv_compare import envhub_echo

    server, port = start_server(args.max_in_flight)
    env = envhub_echo().name
    seconds = args.minutes * 60
    bad = None
    if args.attacks:
        command = [sys.executable, __file__, "--bad", str(port), env, str(seconds)]
        bad = subprocess.Popen([*command, ",".join(args.attacks)], stdout=subprocess.PIPE)
    if args.pin:  # the server alone on the first core; both clients' processes on the second
        os.sched_setaffinity(server.pid, {0})
        for pid in [os.getpid()] + ([bad.pid] if bad else []):
            os.sched_setaffinity(pid, {1})
    processes = {"server": server.pid, "good clients": os.getpid()}
    if bad is not None:
        processes["bad clients"] = bad.pid
    cpu_before = {name: cpu_seconds(pid) for name, pid in processes.items()}
    latencies: list[tuple[float, float]] = []
    rss: list[tuple[float, float]] = []
    start = time.perf_counter()
    until = start + seconds
    url = f"ws://127.0.0.1:{port}/{env}"

    async def sample() -> None:
        process = psutil.Process(server.pid)
        while time.perf_counter() < until:
            rss.append((time.perf_counter(), process.memory_info().rss / 2**20))
            await asyncio.sleep(1.0)

    print(
        f"{'t (s)':>6} {'good steps':>10} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'RSS MB':>7}"
    )
    printed = start

    async def report() -> None:
        nonlocal printed
        while printed + args.every <= until + 0.5:
            await asyncio.sleep(printed + args.every - time.perf_counter())
            window = [s for t, s in latencies if printed <= t < printed + args.every]
            peak = max((m for t, m in rss if printed <= t < printed + args.every), default=0.0)
            printed += args.every
            ms = [1000 * s for s in window]
            print(
                f"{printed - start:>6.0f} {len(ms):>10} {percentile(ms, 0.5):>7.1f} "
                f"{percentile(ms, 0.99):>7.1f} {max(ms, default=float('nan')):>7.1f} {peak:>7.0f}",
                flush=True,
            )

    try:
        await asyncio.gather(
            sample(),
            report(),
            *(good_client(url, until, args.think / 1000, latencies) for _ in range(args.good)),
        )
        cpu = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in processes.items()}
    finally:
        out = bad.communicate(timeout=120)[0] if bad is not None else b"{}"
        server.kill()
        server.wait()
    tally = {"answered": 0, "expected": 0, "unexpected": {}} | json.loads(
        out.decode().strip().splitlines()[-1]
    )
    ms = [1000 * s for _, s in latencies]
    settled = [m for t, m in rss if t >= start + args.every] or [m for _, m in rss]
    p50, p99 = percentile(ms, 0.5), percentile(ms, 0.99)
    print(
        f"\ngood clients: {len(ms)} steps, p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {max(ms):.1f} "
        f"ms (goal: p99 < {P99_GOAL_MS:g} ms: {'met' if p99 < P99_GOAL_MS else 'NOT met'})"
    )
    print(
        f"server RSS: {min(m for _, m in rss):.0f}-{max(m for _, m in rss):.0f} MB over the run, "
        f"{min(settled):.0f}-{max(settled):.0f} MB after the first {args.every:g} s"
    )
    shares = ", ".join(f"{name} {100 * used / seconds:.0f}%" for name, used in cpu.items())
    print(f"CPU (of one core) over the run: {shares}" + (" (pinned)" if args.pin else ""))
    print(
        f"bad requests answered: {tally['answered']:,}, with the expected error or answer: "
        f"{tally['expected']:,}"
        + (f"; other: {tally['unexpected']}" if tally["unexpected"] else "")
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "minutes": args.minutes,
                    "good_steps": len(ms),
                    "p50_ms": p50,
                    "p99_ms": p99,
                    "rss_mb": rss,
                    "bad": tally,
                    "cpu_s": cpu,
                    "pinned": args.pin,
                },
                indent=2,
            )
        )
    return 0


def main() -> None:
    """Parse the flags; run the soak (or, internally, the server or the bad clients)."""
    from envhub.serve.server import ServeSettings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--good", type=int, default=8, help="good clients")
    parser.add_argument(
        "--think", type=float, default=10.0, help="ms between a good step and the next"
    )
    parser.add_argument("--every", type=float, default=30.0, help="seconds per table row")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--max-in-flight",
        type=int,
        default=ServeSettings.model_fields["max_in_flight"].default,
        help="the server's limit per connection (envhub serve --max-in-flight)",
    )
    parser.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument(
        "--attacks",
        nargs="*",
        choices=ATTACKS,
        default=list(ATTACKS),
        help="bad clients to run (none: good clients alone)",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="the server alone on core 0, the clients' processes on core 1 (Linux)",
    )
    parser.add_argument("--bad", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return run_server(int(args.serve[0]), int(args.serve[1]))
    if args.bad:
        port, env, seconds, attacks = args.bad
        return run_bad(int(port), env, float(seconds), attacks.split(","))
    asyncio.run(soak(args))


if __name__ == "__main__":
    main()
