"""``envhub serve-model``: serve a model with vLLM (OpenAI-compatible) until Ctrl-C.

The same start serves ``envhub eval --serve`` (:func:`start_local_vllm`): the model resolved
offline (``smollm2-135m`` from the set-up's wheel), eager mode on a CPU, a context that fits the
model, vLLM's CPU settings (:func:`envhub.inference.vllm_server.cpu_defaults`), progress while it
starts, and a failed start ending in one line, its cause and what to do.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import typer

from envhub.defaults import SMOLLM2_ID

if TYPE_CHECKING:
    from envhub.inference.vllm_server import VLLMServer

DEFAULT_MODEL = SMOLLM2_ID
"""What ``serve-model`` and ``eval --serve`` serve by default: the set-up installs it (offline)."""

DEFAULT_PORT = 8000


def register(app: typer.Typer) -> None:
    """Add the ``envhub serve-model`` command to ``app``."""
    app.command(
        "serve-model",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(serve_model_command)


def serve_model_command(
    ctx: typer.Context,
    model: str = typer.Argument(
        DEFAULT_MODEL, help="A model folder, a Hub id in the local cache, or smollm2-135m."
    ),
    port: int = typer.Option(DEFAULT_PORT, "--port", "-p", help="Port to listen on."),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface)."
    ),
    max_model_len: int = typer.Option(
        None, "--max-model-len", help="Context to allocate (default 4096, or the model's limit)."
    ),
    name: str = typer.Option(
        None, "--name", help="Model name clients request (default: MODEL as given)."
    ),
) -> None:
    """Serve a model with vLLM, OpenAI-compatible, until Ctrl-C.

    Waits until the server answers, prints its URL and the eval and doctor
    lines that use it. Runs eager on a CPU. Arguments after `--` go to vLLM.

    Examples:
        envhub serve-model
        envhub serve-model outputs/train/quickstart/final --port 8001
        envhub serve-model smollm2-135m -- --dtype float32
    """
    from envhub.cli.console import console

    served = name or model
    with sigterm_as_ctrl_c():  # `kill PID` stops it as cleanly as Ctrl-C, even while it starts
        server = start_local_vllm(
            model, served_model_name=served, port=port, host=host, max_model_len=max_model_len,
            extra_args=list(ctx.args),
        )  # fmt: skip
        try:
            for line in next_steps(server.base_url, served, server.host):
                console.print(line, soft_wrap=True, highlight=False, markup=False)
            wait_until_stopped(server)
        finally:
            server.stop()


def local_vllm(
    model: str,
    *,
    served_model_name: str | None = None,
    port: int | None = None,
    host: str = "127.0.0.1",
    max_model_len: int | None = None,
    extra_args: list[str] | None = None,
) -> VLLMServer:
    """A (not yet started) vLLM server for ``model`` with the settings that work here: the model
    resolved offline, eager on a CPU (:func:`serve_flags`), then ``extra_args``."""
    from envhub.inference.vllm_server import VLLMServer
    from envhub.trainer.models import resolve_model

    return VLLMServer(
        resolve_model(model), served_model_name=served_model_name or model, port=port,
        host=host, max_model_len=max_model_len, extra_args=[*serve_flags(), *(extra_args or [])],
    )  # fmt: skip


def start_local_vllm(model: str, **settings) -> VLLMServer:
    """Start :func:`local_vllm` with a spinner and progress lines; returns it once it answers.

    A failed start prints where the full log is and raises an error whose message is one line,
    the cause and what to do.
    """
    from envhub.cli.console import err_console
    from envhub.errors import EngineStartError, EngineUnavailableError

    server = local_vllm(model, **settings)
    with err_console.status(
        f"starting vLLM for {model} (a first start on a CPU takes a minute or two; "
        f"log: {server.log_path})"
    ):
        try:
            server.start()
        except EngineStartError as e:
            err_console.print(
                f"vLLM did not start; its full log: {e.log_path}", soft_wrap=True, highlight=False
            )
            raise EngineUnavailableError(e.summary) from None  # the path is on the line above
        except BaseException:  # Ctrl-C while it starts: no engine process outlives the command
            server.stop()
            raise
    err_console.print(f"vLLM ready at {server.base_url}", soft_wrap=True)
    return server


def serve_flags() -> list[str]:
    """``vllm serve`` flags for a local server: eager on the CPU, where graph compilation costs
    more than it saves in an eval (SmolLM2-135M on 2 cores starts in 44-47 s eager, 139-161 s
    compiled, and generates 13% slower); GPUs keep compilation and CUDA graphs."""
    import torch  # noqa: TID251 -- lazy: only a local server needs it, and vLLM imports torch

    return [] if torch.cuda.is_available() else ["--enforce-eager"]


def next_steps(base_url: str, served: str, host: str) -> list[str]:
    """What to print once the server answers: its URL and the commands that use it."""
    if host in ("0.0.0.0", "::"):  # listening everywhere: local clients still use loopback
        base_url = base_url.replace(f"//{host}:", "//127.0.0.1:", 1)
    import shlex

    quoted = shlex.quote(served)
    return [
        f"serving {served} at {base_url}/v1 (OpenAI-compatible)",
        "use it from another terminal:",
        f"  envhub eval ENV -u {base_url}/v1 -m {quoted}",
        f"  envhub doctor -u {base_url}",
        "Ctrl-C stops it.",
    ]


@contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """Within the block, SIGTERM raises KeyboardInterrupt, as Ctrl-C does; the previous handler
    is back after it."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def wait_until_stopped(server: VLLMServer) -> None:
    """Block until Ctrl-C or SIGTERM (then stop the server, whole, and return) or until the
    server exits on its own (then raise with the cause found in its log)."""
    from envhub.cli.console import err_console
    from envhub.errors import EngineUnavailableError

    assert server.process is not None
    try:
        with sigterm_as_ctrl_c():
            code = server.process.wait()
    except KeyboardInterrupt:
        err_console.print("stopping vLLM ...")
        server.stop()
        err_console.print("vLLM stopped")
        return
    failure = server.start_failure()
    err_console.print(f"vLLM's full log: {failure.log_path}", soft_wrap=True, highlight=False)
    raise EngineUnavailableError(f"vLLM exited with code {code}: {failure.summary}")
