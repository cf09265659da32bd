"""``envhub serve-model``'s parts that need no vLLM: the settings, what it prints once ready,
its foreground wait (a signal stops the server; a server that dies says why), a model path that
does not exist. A real vLLM served, used and stopped is in tests/e2e/test_serve_model_vllm.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from envhub.cli.serve_model import (
    local_vllm,
    next_steps,
    serve_flags,
    start_local_vllm,
    wait_until_stopped,
)
from envhub.errors import EngineUnavailableError
from envhub.inference.vllm_server import VLLMServer, free_port


def test_a_local_server_runs_eager_on_the_cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert serve_flags() == ["--enforce-eager"]
    server = local_vllm("Org/model", port=1234, extra_args=["--dtype", "float32"])
    assert server.command()[-3:] == ["--enforce-eager", "--dtype", "float32"]
    assert (server.served_model_name, server.max_model_len) == ("Org/model", 4096)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert serve_flags() == []


def test_the_lines_it_prints_name_the_url_and_the_commands_that_use_it() -> None:
    assert next_steps("http://127.0.0.1:8000", "smollm2-135m", "127.0.0.1") == [
        "serving smollm2-135m at http://127.0.0.1:8000/v1 (OpenAI-compatible)",
        "use it from another terminal:",
        "  envhub eval ENV -u http://127.0.0.1:8000/v1 -m smollm2-135m",
        "  envhub doctor -u http://127.0.0.1:8000",
        "Ctrl-C stops it.",
    ]
    # Listening on every interface: local clients use loopback; a name with a space is quoted.
    lines = next_steps("http://0.0.0.0:9000", "my model", "0.0.0.0")
    assert lines[2] == "  envhub eval ENV -u http://127.0.0.1:9000/v1 -m 'my model'"


def test_the_evaluation_guide_shows_what_the_default_server_prints() -> None:
    # What a user saw: the guide showed `serving smollm2-135m`, the server printed the Hub id.
    from envhub.cli.serve_model import DEFAULT_MODEL

    guide = (Path(__file__).parents[2] / "docs" / "guides" / "evaluation.md").read_text()
    shown = guide.split("stop the server's whole process group:\n\n```text\n")[1].split("```")[0]
    assert shown.splitlines() == next_steps("http://127.0.0.1:8000", DEFAULT_MODEL, "127.0.0.1")


class Child(VLLMServer):
    """A server without vLLM: it logs a line and answers /health; with ``dies``, it exits with
    code 3 right after its first answer."""

    dies = False

    def command(self) -> list[str]:
        script = (
            "import http.server, os\n"
            "print('RuntimeError: the engine died', flush=True)\n"
            "class H(http.server.BaseHTTPRequestHandler):\n"
            "    def do_GET(self):\n"
            "        self.send_response(200); self.end_headers(); self.wfile.flush()\n"
            f"        if {self.dies}: os._exit(3)\n"
            f"http.server.HTTPServer(('127.0.0.1', {self.port}), H).serve_forever()\n"
        )
        return [sys.executable, "-c", script]


def test_sigterm_stops_the_server_and_returns() -> None:
    server = Child("m", port=free_port())
    server.start()
    try:
        assert server.process is not None
        before = signal.getsignal(signal.SIGTERM)

        def terminate_once_handled() -> None:  # the default action would end pytest
            while signal.getsignal(signal.SIGTERM) == before:
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=terminate_once_handled, daemon=True).start()
        wait_until_stopped(server)
        assert server.process.poll() is not None
    finally:
        server.stop()
    assert signal.getsignal(signal.SIGTERM) == before


def test_ctrl_c_while_it_starts_stops_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    import envhub.cli.serve_model as serve_model

    class NeverReady(VLLMServer):
        def command(self) -> list[str]:
            return [sys.executable, "-c", "import time; time.sleep(3600)"]

    started: list[VLLMServer] = []

    def never_ready(model: str, **settings) -> VLLMServer:
        started.append(NeverReady(model, port=free_port()))
        return started[0]

    def interrupt_once_started() -> None:
        while not started or started[0].process is None:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(serve_model, "local_vllm", never_ready)
    threading.Thread(target=interrupt_once_started, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        start_local_vllm("m")
    assert started[0].process is not None and started[0].process.poll() is not None


def test_a_server_that_dies_while_serving_says_why() -> None:
    class Dying(Child):
        dies = True

    server = Dying("m", port=free_port())
    server.start()
    try:
        with pytest.raises(EngineUnavailableError) as info:
            wait_until_stopped(server)
    finally:
        server.stop()
    assert str(info.value) == (
        "vLLM exited with code 3: RuntimeError: the engine died — the full log says more"
    )


def test_a_model_path_that_does_not_exist_fails_before_vllm_starts(tmp_path) -> None:
    missing = tmp_path / "no-such-model"
    result = subprocess.run(
        [sys.executable, "-m", "envhub.cli", "serve-model", str(missing)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        f"error: model {str(missing)!r} does not exist — give a Hugging Face model folder "
        "(config.json, weights, tokenizer), a Hub id such as HuggingFaceTB/SmolLM2-135M-Instruct, "
        "or the alias smollm2-135m (installed by the set-up)"
    )
