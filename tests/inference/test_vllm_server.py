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
    server = VLLMServer("/models/m", served_model_name="m", port=1234, max_model_len=2048, seed=7, extra_args=["--dtype", "float32"])
    assert server.command() == [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/m", "--served-model-name", "m",
        "--host", "127.0.0.1", "--port", "1234", "--max-model-len", "2048", "--seed", "7", "--dtype", "float32",
    ]  # fmt: skip
    assert server.base_url == "http://127.0.0.1:1234"


def test_stop_without_start_is_a_no_op():
    VLLMServer("m", port=free_port()).stop()
