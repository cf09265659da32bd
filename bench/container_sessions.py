"""The container back end's costs, side by side with the engine itself and the local sandbox.

- **Session start**: a container session's first call (``podman run`` of the default image,
  its folders laid out, then ``true``) against ``podman run --rm IMAGE true`` and a local
  (bubblewrap) session's first ``true``.
- **A command**: ``true`` in a started session against ``podman exec CONTAINER true`` of the
  same container and a local session's ``true``.
- **32 sessions at once**: wall time to start 32 container sessions, run ``echo`` in each and
  close them; then whether any container is left.

p50 and p90 in milliseconds. Needs Podman, the default image (``scripts/container_base.sh``),
and root with bubblewrap for the local column.

    .venv/bin/python bench/container_sessions.py [--runs 20]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import time
from collections.abc import Awaitable, Callable

from envhub.sandbox import LocalSandbox
from envhub.sandbox.container import DEFAULT_IMAGE, ContainerSandbox
from envhub.sandbox.container_engine import ContainerEngine


def percentiles(samples: list[float]) -> str:
    """``p50 / p90`` in ms."""
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return f"{statistics.median(ordered) * 1000:7.1f} / {p90 * 1000:7.1f}"


async def timed(action: Callable[[], Awaitable[object]]) -> float:
    """Seconds ``action()`` took."""
    started = time.perf_counter()
    await action()
    return time.perf_counter() - started


def engine_seconds(argv: list[str]) -> float:
    """Seconds one engine command took."""
    started = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    return time.perf_counter() - started


async def starts(sandbox: object, runs: int) -> list[float]:
    """Seconds from a new session to the end of its first ``true`` (closing not counted)."""
    out = []
    for _ in range(runs):
        session = sandbox.session()  # type: ignore[attr-defined]
        out.append(await timed(lambda s=session: s.arun("true")))
        await session.aclose()
    return out


async def commands(sandbox: object, runs: int) -> list[float]:
    """Seconds of each ``true`` in one started session."""
    async with sandbox.session() as session:  # type: ignore[attr-defined]
        await session.arun("true")
        return [await timed(lambda: session.arun("true")) for _ in range(runs)]


async def many_at_once(sandbox: ContainerSandbox, count: int) -> float:
    """Seconds to start ``count`` sessions, run ``echo`` in each, and close them all."""

    async def one(i: int) -> None:
        async with sandbox.session() as session:
            result = await session.arun(["echo", str(i)])
            assert result.stdout == f"{i}\n", result

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(count)))
    return time.perf_counter() - started


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--concurrent", type=int, default=32)
    args = parser.parse_args()
    engine = ContainerEngine("podman")
    container = ContainerSandbox(engine=engine)
    flags = engine.run_flags(256)
    raw_start = [
        engine_seconds(
            engine.command("run", "--rm", "--network=none", *flags, DEFAULT_IMAGE, "true")
        )
        for _ in range(args.runs)
    ]
    keeper = engine.call("run", "-d", "--network=none", *flags, *container.init_args(),
                         "--entrypoint=/bin/sh", DEFAULT_IMAGE, "-c", container.init_exec())
    keeper = keeper.strip()  # fmt: skip
    try:
        raw_exec = [
            engine_seconds(engine.command("exec", keeper, "true")) for _ in range(args.runs)
        ]
    finally:
        engine.remove([keeper])
    with LocalSandbox() as local:
        rows = [
            ("session start", asyncio.run(starts(container, args.runs)), raw_start,
             asyncio.run(starts(local, args.runs))),
            ("a command (true)", asyncio.run(commands(container, args.runs)), raw_exec,
             asyncio.run(commands(local, args.runs))),
        ]  # fmt: skip
    columns = ("container session", "podman itself", "local session")
    print(f"{'ms, p50 / p90':<18} " + " ".join(f"{c:>19}" for c in columns))
    for name, ours, raw, local_ in rows:
        print(
            f"{name:<18} {percentiles(ours):>19} {percentiles(raw):>19} {percentiles(local_):>19}"
        )
    seconds = asyncio.run(many_at_once(container, args.concurrent))
    left = engine.call(
        "ps", "-a", "-q", "--filter", f"label=envhub.owner={container.owner}"
    ).split()
    print(f"{args.concurrent} sessions at once (start, echo, close): {seconds:.1f} s; "
          f"containers left: {len(left)}")  # fmt: skip


if __name__ == "__main__":
    main()
