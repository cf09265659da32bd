"""Push / pull / install times of an ``envhub init`` package against the local Hub-API server
(tests/hub/hub_server.py) with the real ``huggingface_hub`` client. Medians of a few runs.

    .venv/bin/python bench/hub_push_install.py

What is timed: ``push`` without gates (upload + tag), the gates alone (``check_package`` with
the package's own tests), ``pull`` (resolve + download + verify, cold cache), and ``install``
into a fresh venv (``pip install --no-index --no-build-isolation`` of the verified snapshot).
Loopback only: on huggingface.co, network latency adds to every request.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "hub"))

RUNS = 5


def timed(fn, runs: int = RUNS) -> float:
    """Call ``fn(i)`` for ``i`` in ``range(runs)`` and return the median wall-clock seconds.

    The run index lets each call work on its own version or cache directory.
    """
    times = []
    for i in range(runs):
        started = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    """Start the local Hub server, time push / gates / pull / install, and print the medians.

    Everything (Hub home, envhub cache, the package and the venv) lives in a temporary
    directory that is removed at the end.
    """
    from hub_server import HubServer
    from venvs import fresh_venv

    tmp = Path(tempfile.mkdtemp(prefix="envhub-bench-"))
    server = HubServer({"alice": "hf_alice"}).start()
    os.environ.update(
        HF_ENDPOINT=server.url,
        HF_HOME=str(tmp / "hf"),
        ENVHUB_CACHE=str(tmp / "cache"),
        HF_HUB_DISABLE_PROGRESS_BARS="1",  # keep the table readable
    )
    os.chdir(tmp)
    from envhub.checks.package import check_package
    from envhub.hub import install, pull, push
    from envhub.scaffold import create_package

    package = create_package("bench-env", directory=tmp / "src")
    pyproject, env_py = package / "pyproject.toml", package / "bench_env" / "env.py"

    def push_version(i: int) -> None:
        for path in (pyproject, env_py):
            text = path.read_text()
            path.write_text(text.replace(f'version = "0.{i}.0"', f'version = "0.{i + 1}.0"'))
        push(package, token="hf_alice", check=False)

    for path in (pyproject, env_py):  # start from 0.0.0 so that run i publishes 0.(i+1).0
        path.write_text(path.read_text().replace('version = "0.1.0"', 'version = "0.0.0"'))
    rows = [("push, no gates (upload + tag)", timed(push_version))]
    rows.append(
        (
            "gates (check_package, package tests included)",
            timed(lambda i: check_package(package), 3),
        )
    )

    def cold_pull(i: int) -> None:
        os.environ["ENVHUB_CACHE"] = str(tmp / f"cache-{i}")  # an empty cache each time
        pull(f"alice/bench-env@0.{i + 1}.0")

    rows.append(("pull, cold cache (resolve + download + verify)", timed(cold_pull)))
    python = str(fresh_venv(tmp / "venv"))
    rows.append(
        (
            "install into a fresh venv (pull + verify + pip)",
            timed(
                lambda i: install(
                    f"alice/bench-env@0.{i + 1}.0",
                    trust=True,
                    python=python,
                    offline=True,
                    lock_file=None,
                ),
                3,
            ),
        )
    )
    server.stop()
    shutil.rmtree(tmp, ignore_errors=True)
    width = max(len(name) for name, _ in rows)
    print(f"{'step':<{width}}  median s")
    for name, seconds in rows:
        print(f"{name:<{width}}  {seconds:8.3f}")


if __name__ == "__main__":
    main()
