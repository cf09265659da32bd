"""Sandbox throughput and latency: executions/s and p50/p99 of ``print(1)`` and of a 10-case
unit-test reward, sequential and with concurrency 2/8/32: the local bubblewrap sandbox (as
made: as root, Python runs forked from a zygote into sandboxes started ahead; with a stub
interpreter per warm sandbox instead, ``zygote=False``; and cold: ``warm=0``), and the e2b
backend through the real e2b SDK to envhub's local envd on 127.0.0.1 (which runs each command
in the local sandbox, so its rows are the local ones plus the SDK and RPC), against a bare
``python3 -c`` on the host (the limit: no sandbox at all).

    .venv/bin/python bench/sandbox_throughput.py [--runs 64] [--no-e2b]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from envhub.rewards.code import run_tests
from envhub.sandbox import Limits, LocalSandbox, Sandbox

# The local envd is a test helper (tests/sandbox/envd_local.py), not part of the package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "sandbox"))

ADD = "def add(a, b):\n    return a + b\n"
CASES = [{"fn": "add", "args": [i, i], "expected": 2 * i} for i in range(5)] + [
    f"assert add({i}, 1) == {i + 1}" for i in range(5)
]


async def bare_print() -> None:
    """Run ``print(1)`` in a bare host interpreter, with no sandbox (the limit)."""
    # The interpreter the sandbox runs (a `python3` on PATH may be a slow pyenv shim).
    proc = await asyncio.create_subprocess_exec(
        "/usr/bin/python3", "-c", "print(1)", stdout=asyncio.subprocess.PIPE
    )
    await proc.communicate()


async def measure(
    job: Callable[[], Awaitable[object]], runs: int, concurrency: int
) -> tuple[float, float, float]:
    """(executions/s, p50 ms, p99 ms) of ``runs`` calls, ``concurrency`` at a time."""
    latencies: list[float] = []
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            started = time.perf_counter()
            await job()
            latencies.append(time.perf_counter() - started)

    await job()  # warm-up
    started = time.perf_counter()
    await asyncio.gather(*[one() for _ in range(runs)])
    elapsed = time.perf_counter() - started
    cuts = statistics.quantiles(latencies, n=100)
    return runs / elapsed, 1000 * statistics.median(latencies), 1000 * cuts[98]


def jobs_for(name: str, box: Sandbox) -> dict[str, Callable[[], Awaitable[object]]]:
    """The two jobs to time on ``box``, keyed by their row labels (prefixed with ``name``).

    One runs ``print(1)``, the other scores :data:`ADD` on the 10 :data:`CASES`; each asserts
    that its result is right, so a broken sandbox cannot post a fast time.
    """

    async def printed() -> None:
        result = await box.arun_python("print(1)")
        assert result.stdout == "1\n", result

    async def unit_tests() -> None:
        report = await run_tests(box, ADD, CASES, timeout=5)
        assert report.pass_rate == 1.0, report

    return {f"{name} print(1)": printed, f"{name} 10-case reward": unit_tests}


async def main(runs: int, e2b: bool) -> None:
    """Time every job at concurrency 1, 2, 8 and 32 and print a row for each.

    Args:
        runs: Timed executions per row (after one warm-up).
        e2b: Also time the e2b backend against a local envd started for the run.
    """
    local = LocalSandbox(Limits(wall_time=30), max_concurrency=32)
    stub = LocalSandbox(Limits(wall_time=30), max_concurrency=32, zygote=False)
    cold = LocalSandbox(Limits(wall_time=30), max_concurrency=32, warm=0, zygote=False)
    jobs: dict[str, Callable[[], Awaitable[object]]] = {
        "host python -c print(1)": bare_print,
        **jobs_for("local" + (" (zygote)" if local.zygote else ""), local),
        **({**jobs_for("local stub", stub)} if local.zygote else {}),
        **jobs_for("local cold", cold),
    }
    envd = contextlib.ExitStack()
    if e2b:
        from envd_local import local_envd_process

        from envhub.sandbox.e2b import E2BSandbox

        url = envd.enter_context(local_envd_process())
        remote = E2BSandbox(Limits(wall_time=30), debug=True, sandbox_url=url, http_version="1.1")
        jobs.update(jobs_for("e2b->envd", remote))
    print(f"{'what':28} {'conc':>4} {'exec/s':>8} {'p50 ms':>8} {'p99 ms':>8}")
    try:
        for name, job in jobs.items():
            for concurrency in (1, 2, 8, 32):
                rate, p50, p99 = await measure(job, runs, concurrency)
                print(
                    f"{name:28} {concurrency:>4} {rate:>8.1f} {p50:>8.1f} {p99:>8.1f}", flush=True
                )
    finally:
        envd.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=64)
    parser.add_argument("--no-e2b", action="store_true", help="skip the e2b rows")
    args = parser.parse_args()
    asyncio.run(main(args.runs, not args.no_e2b))
