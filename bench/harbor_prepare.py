"""A Harbor task with RUN steps: its preparation, cold and cached, and an episode's reset after
it, against the same task without RUN steps (its files only).

Phases, p50 in milliseconds over ``--repeats``:

- ``prepare (cold)``: the RUN steps run in a fresh session and the result is stored (a new
  cache folder each time);
- ``prepare (disk cache)``: another process's view: the prepared folder is found on disk;
- ``prepare (memory)``: this process prepared it already;
- ``reset``: an episode's reset (its session opened on the prepared workspace), for the RUN task
  and for the same files given by ``COPY`` alone (the baseline).

Needs root and bubblewrap (as local sessions do).

    .venv/bin/python bench/harbor_prepare.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from envhub.harbor import build as builds
from envhub.harbor.dockerfile import sandbox_python_version
from envhub.harbor.env import HarborEnv
from envhub.sandbox import LocalSandbox

IMAGE = f"python:{sandbox_python_version()}-slim"
STEPS = "RUN mkdir -p data && for i in $(seq 1 200); do echo $i > data/$i.txt; done\n"


def make_task(root: Path, steps: str) -> Path:
    """A task folder whose Dockerfile is ``steps`` after ``FROM`` and ``WORKDIR /app``."""
    folder = root / "task"
    for sub in ("environment", "tests"):
        (folder / sub).mkdir(parents=True)
    (folder / "task.toml").write_text('version = "1.0"\n')
    (folder / "instruction.md").write_text("Do nothing.\n")
    (folder / "tests/test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (folder / "environment/Dockerfile").write_text(f"FROM {IMAGE}\nWORKDIR /app\n{steps}")
    return folder


def ms(started: float) -> float:
    """Milliseconds since ``started`` (a ``perf_counter``)."""
    return (time.perf_counter() - started) * 1000


def prepare_times(env: HarborEnv, cache: Path) -> tuple[float, float, float]:
    """(cold, disk, memory) milliseconds of :meth:`HarborEnv.prepare_workspace`."""
    row = env.dataset[0]
    shutil.rmtree(cache, ignore_errors=True)
    builds.PREPARED.clear()
    started = time.perf_counter()
    asyncio.run(env.prepare_workspace(row))
    cold = ms(started)
    builds.PREPARED.clear()
    started = time.perf_counter()
    asyncio.run(env.prepare_workspace(row))
    disk = ms(started)
    started = time.perf_counter()
    asyncio.run(env.prepare_workspace(row))
    return cold, disk, ms(started)


def reset_time(env: HarborEnv) -> float:
    """Milliseconds of an episode's reset (the episode then ends with an answer)."""
    started = time.perf_counter()
    env.reset(options={"task_index": 0})
    took = ms(started)
    env.step("done")
    return took


def main() -> None:
    """Time the phases and print them side by side."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="envhub-bench-"))
    cache = root / "cache"
    os.environ["ENVHUB_CACHE"] = str(cache)
    try:
        with LocalSandbox(max_concurrency=2, warm=0) as sandbox:
            with_run = HarborEnv(make_task(root / "run", STEPS), sandbox=sandbox)
            plain_folder = make_task(root / "plain", "COPY data /app/data\n")
            (plain_folder / "environment/data").mkdir()
            for i in range(1, 201):
                (plain_folder / f"environment/data/{i}.txt").write_text(f"{i}\n")
            plain = HarborEnv(plain_folder, sandbox=sandbox)
            timings = [prepare_times(with_run, cache) for _ in range(args.repeats)]
            resets = [reset_time(with_run) for _ in range(args.repeats)]
            plain_resets = [reset_time(plain) for _ in range(args.repeats)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    p50 = statistics.median
    print(f"{'phase (200 files made by RUN)':<34}{'p50 ms':>10}")
    names = ("prepare (cold)", "prepare (disk cache)", "prepare (memory)")
    for name, column in zip(names, zip(*timings, strict=True), strict=True):
        print(f"{name:<34}{p50(column):>10.1f}")
    print(f"{'reset, RUN task':<34}{p50(resets):>10.1f}")
    print(f"{'reset, same files by COPY (base)':<34}{p50(plain_resets):>10.1f}")


if __name__ == "__main__":
    main()
