"""The local vLLM launcher's pure parts (starting a real server is covered in tests/e2e)."""

import os
import sys

from envhub.inference.vllm_server import VLLMServer, cpu_defaults, free_port


def test_cpu_defaults_bind_every_core_on_small_machines_unless_parallel():
    cores = sorted(os.sched_getaffinity(0))
    defaults = cpu_defaults()
    assert defaults["VLLM_CPU_KVCACHE_SPACE"] == "2"
    if len(cores) <= 8:
        assert defaults["VLLM_CPU_OMP_THREADS_BIND"] == ",".join(map(str, cores))
    assert "VLLM_CPU_OMP_THREADS_BIND" not in cpu_defaults(["--tensor-parallel-size", "2"])


def test_command_uses_the_api_server_module_on_loopback():
    server = VLLMServer(
        "/models/m",
        served_model_name="m",
        port=1234,
        max_model_len=2048,
        seed=7,
        extra_args=["--dtype", "float32"],
    )
    assert server.command() == [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/m",
        "--served-model-name", "m", "--host", "127.0.0.1", "--port", "1234",
        "--max-model-len", "2048", "--seed", "7", "--dtype", "float32",
    ]  # fmt: skip
    assert server.base_url == "http://127.0.0.1:1234"


def test_stop_without_start_is_a_no_op():
    VLLMServer("m", port=free_port()).stop()


def test_the_context_defaults_to_4096_or_the_models_own_smaller_limit(tmp_path):
    import json

    short, long, bare = tmp_path / "short", tmp_path / "long", tmp_path / "bare"
    for folder, config in (
        (short, {"max_position_embeddings": 1024}),
        (long, {"max_position_embeddings": 32768}),
        (bare, {}),
    ):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
    assert [VLLMServer(str(f)).max_model_len for f in (short, long, bare)] == [1024, 4096, 4096]
    assert VLLMServer("Org/hub-model").max_model_len == 4096  # not local: vLLM checks it
    assert VLLMServer(str(short), max_model_len=512).max_model_len == 512


class SlowServer(VLLMServer):
    """A child that logs a line, takes 1.5 s to start, then answers /health: what a log file
    sees of a vLLM start, without vLLM (the real start is in tests/e2e)."""

    def command(self) -> list[str]:
        script = (
            "import http.server, sys, time\n"
            "print('loading weights', flush=True)\n"
            "time.sleep(1.5)\n"
            "class H(http.server.BaseHTTPRequestHandler):\n"
            "    def do_GET(self):\n"
            "        self.send_response(200); self.end_headers()\n"
            f"http.server.HTTPServer(('127.0.0.1', {self.port}), H).serve_forever()\n"
        )
        return [sys.executable, "-c", script]


def test_a_start_is_never_silent(monkeypatch, caplog):
    import logging
    import re

    import envhub.inference.vllm_server as vllm_server

    monkeypatch.setattr(vllm_server, "PROGRESS_EVERY", 0.3)
    server = SlowServer("m", port=free_port())
    try:
        with caplog.at_level(logging.INFO, logger="envhub.inference.vllm_server"):
            server.start()
    finally:
        server.stop()
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == f"starting vLLM for m at {server.base_url} (log: {server.log_path})"
    waiting = lines[1:-1]
    assert waiting and all(
        line.startswith("vLLM still starting after ") and line.endswith(" s: loading weights")
        for line in waiting
    )
    assert re.fullmatch(r"vLLM ready after \d+ s", lines[-1])
