"""``envhub serve-trainer``: started as a user starts it, reached with the real ``tinker`` SDK."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envhub.defaults import LOOPBACK, SMOLLM2_ID, free_port

tinker = pytest.importorskip("tinker")


def test_next_steps_names_the_url_and_the_variables() -> None:
    from envhub.cli.serve_trainer import next_steps
    from envhub.trainer.service import ServiceSettings

    settings = ServiceSettings(host="0.0.0.0", port=8123, api_key="tml-abc", models=("m1", "m2"))
    assert next_steps(settings) == [
        "serving the Tinker API on envhub's trainer at http://127.0.0.1:8123",
        "models: m1, m2",
        "point the tinker SDK at it (in the shell that runs your loop):",
        "  export TINKER_BASE_URL=http://127.0.0.1:8123",
        "  export TINKER_API_KEY=tml-abc",
        "Ctrl-C stops it.",
    ]


def test_each_option_defaults_to_its_settings_field() -> None:
    """One source: the command's defaults are ``ServiceSettings``'s (the port, the sampler, the
    state folder, ...), none written twice."""
    import inspect

    from envhub.cli.serve_trainer import serve_trainer_command
    from envhub.trainer.service import ServiceSettings

    defaults = ServiceSettings(api_key="tml-x")
    options = inspect.signature(serve_trainer_command).parameters
    shared = [name for name in options if name in ServiceSettings.model_fields]
    assert sorted(shared) == ["api_key", "backend", "device", "full_weights", "host", "models",
                              "pipeline_parallel", "port", "sampler", "session_timeout_s",
                              "state_dir", "tensor_parallel", "vllm_max_full_weight_engines",
                              "vllm_max_lora_rank"]  # fmt: skip
    for name in set(shared) - {"api_key", "models"}:  # a key is made per run; models: an argument
        assert options[name].default.default == getattr(defaults, name), name
    assert defaults.port == 8010  # beside serve-model's 8000


def test_serve_trainer_answers_the_sdk_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    env = os.environ | {"TINKER_API_KEY": "tml-from-the-environment", "COLUMNS": "200"}
    command = [sys.executable, "-m", "envhub.cli", "serve-trainer", "--port", str(port),
               "--state-dir", str(tmp_path), "--device", "cpu"]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    try:
        lines = []
        deadline = time.monotonic() + 60
        while not lines or lines[-1] != "Ctrl-C stops it.":
            assert time.monotonic() < deadline and process.poll() is None, lines
            lines.append(process.stdout.readline().rstrip("\n"))
        assert f"  export TINKER_BASE_URL=http://{LOOPBACK}:{port}" in lines
        assert "  export TINKER_API_KEY=tml-from-the-environment" in lines
        client = tinker.ServiceClient(
            base_url=f"http://{LOOPBACK}:{port}", api_key="tml-from-the-environment"
        )
        with pytest.warns(FutureWarning):  # the SDK prefers RestClient; both call one route
            capabilities = client.get_server_capabilities()
        assert [m.model_name for m in capabilities.supported_models] == [SMOLLM2_ID]
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
    assert code == 0


def test_megatron_without_gpus_is_refused_before_the_server_starts(tmp_path: Path) -> None:
    """No GPU here: the command says why in the service's words and exits 1 (not a startup
    traceback after which the server exits 0)."""
    pytest.importorskip("megatron.core")
    from envhub.trainer.megatron.rank_setup import SETUP_ENV  # the tests' CPU ranks: not here

    env = {k: v for k, v in os.environ.items() if k != SETUP_ENV}
    command = [sys.executable, "-m", "envhub.cli", "serve-trainer", "--backend", "megatron",
               "--device", "cpu", "--state-dir", str(tmp_path)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env | {"COLUMNS": "300"},
                          timeout=120)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "serve-trainer --backend megatron cannot start: backend.kind=megatron needs CUDA" in (
        done.stdout + done.stderr
    )
    assert "(the service's flag: --backend torch)" in done.stdout + done.stderr
    assert "Traceback" not in done.stderr
