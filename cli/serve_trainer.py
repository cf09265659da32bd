"""``envhub serve-trainer``: the Tinker API on envhub's trainer, until Ctrl-C.

Starts :mod:`envhub.trainer.service` under uvicorn and, once it answers, prints its URL and
the two environment lines that point the ``tinker`` SDK (and the cookbook's recipes) at it.
Models load when a client creates one, not at start.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import typer

from envhub.cli.options import settings_option
from envhub.defaults import LOOPBACK, SMOLLM2_ID
from envhub.trainer.service.settings import ServiceSettings

KEY_VARIABLE = "TINKER_API_KEY"
"""Read for the service's key when ``--api-key`` is not given (else a fresh key is made)."""


def _setting(name: str, *flags: str, help: str) -> Any:
    """The option ``--NAME`` (with ``flags`` beside it) for the settings field ``name``, its
    default the field's (one source: :class:`ServiceSettings`)."""
    return settings_option(ServiceSettings, name, *flags, help=help)


def register(app: typer.Typer) -> None:
    """Add the ``envhub serve-trainer`` command to ``app``."""
    app.command("serve-trainer")(serve_trainer_command)


def serve_trainer_command(
    models: list[str] = typer.Argument(
        None,
        help=f"Base models clients may train and sample (default {SMOLLM2_ID}); "
        "NAME=MODEL serves MODEL to clients that ask for NAME.",
    ),
    port: int = _setting("port", "-p", help="Port to listen on."),
    host: str = _setting("host", help="Address to listen on (0.0.0.0: every interface)."),
    api_key: str = typer.Option(
        None, "--api-key", help=f"The key clients send (default: ${KEY_VARIABLE}, else a new one)."
    ),
    state_dir: Path = _setting("state_dir", help="Where saved weights go."),
    device: str = _setting("device", help="auto, cpu or cuda."),
    sampler: str = _setting(
        "sampler",
        help="hf (in process) or vllm (an engine per base model, LoRA versions "
        "as adapters on it; an engine per full-weight model, its versions' weights loaded "
        "into it).",
    ),
    vllm_max_lora_rank: int = _setting(
        "vllm_max_lora_rank", help="The largest LoRA rank the vllm sampler serves."
    ),
    vllm_max_full_weight_engines: int = _setting(
        "vllm_max_full_weight_engines", "--full-weight-engines",
        help="With --sampler vllm: the most engines of full-weight models at once (the "
        "least recently used idle one stops).",
    ),
    backend: str = _setting(
        "backend",
        help="torch (in process; LoRA and full weights) or megatron (full-weight models on "
        "megatron-core ranks that Ray places; LoRA refused).",
    ),
    full_weights: bool = _setting(
        "full_weights",
        help="Train every weight of each model, whatever LoRA rank the client asks for (the "
        "SDK asks for one): SDK loops on --backend megatron need it.",
    ),
    tensor_parallel: int = _setting(
        "tensor_parallel", help="With --backend megatron: ranks each layer is split over."
    ),
    pipeline_parallel: int = _setting(
        "pipeline_parallel", help="With --backend megatron: pipeline stages."
    ),
    session_timeout_s: float = _setting(
        "session_timeout_s", "--session-timeout",
        help="Seconds without a heartbeat after which a client's session is ended and its "
        "models freed (the SDK sends one every 10 s).",
    ),
) -> None:
    """Serve the Tinker training API on envhub's trainer until Ctrl-C.

    A loop written with the official `tinker` SDK (forward_backward, optim_step,
    save_weights_for_sampler, sample) trains here once TINKER_BASE_URL and
    TINKER_API_KEY point at it; the command prints both lines.

    Examples:
        envhub serve-trainer
        envhub serve-trainer smollm2-135m --port 8011 --device cpu
        envhub serve-trainer meta-llama/Llama-3.2-1B=smollm2-135m
        envhub serve-trainer smollm2-135m --sampler vllm
        envhub serve-trainer Qwen/Qwen3-8B --backend megatron --full-weights
    """
    from envhub.cli.serve_model import sigterm_as_ctrl_c
    from envhub.errors import MissingDependencyError
    from envhub.trainer.service import build_app, new_api_key

    try:
        import uvicorn
    except ImportError as e:
        raise MissingDependencyError.for_extra("uvicorn", "service") from e
    named = {"models": tuple(models)} if models else {}  # else the settings' default
    settings = ServiceSettings(
        **named, port=port, host=host, device=device,
        api_key=api_key or os.environ.get(KEY_VARIABLE) or new_api_key(),
        state_dir=state_dir, sampler=sampler, vllm_max_lora_rank=vllm_max_lora_rank,
        vllm_max_full_weight_engines=vllm_max_full_weight_engines,
        backend=backend, full_weights=full_weights, tensor_parallel=tensor_parallel,
        pipeline_parallel=pipeline_parallel,
        session_timeout_s=session_timeout_s,
    )  # fmt: skip
    if settings.backend == "megatron":  # refused here with its reason, not in a traceback
        from envhub.trainer.service.megatron_training import service_ray_cpus

        service_ray_cpus(settings)
    server = uvicorn.Server(
        uvicorn.Config(build_app(settings), host=host, port=port, log_level="warning")
    )
    threading.Thread(target=_announce, args=(server, settings), daemon=True).start()
    with sigterm_as_ctrl_c():
        try:
            server.run()
        except KeyboardInterrupt:
            pass


def _announce(server: Any, settings: ServiceSettings) -> None:
    """Print :func:`next_steps` once ``server`` (uvicorn's) accepts connections."""
    from envhub.cli.console import console

    while not server.started:
        if server.should_exit:
            return
        time.sleep(0.05)
    for line in next_steps(settings):
        console.print(line, soft_wrap=True, highlight=False, markup=False)


def next_steps(settings: ServiceSettings) -> list[str]:
    """What to print once the service answers: its URL, the lines a user sets, the models."""
    host = settings.host
    if host in ("0.0.0.0", "::"):  # listening everywhere: local clients still use loopback
        host = LOOPBACK
    url = f"http://{host}:{settings.port}"
    return [
        f"serving the Tinker API on envhub's trainer at {url}",
        f"models: {', '.join(settings.models)}",
        "point the tinker SDK at it (in the shell that runs your loop):",
        f"  export TINKER_BASE_URL={url}",
        f"  export {KEY_VARIABLE}={settings.api_key}",
        "Ctrl-C stops it.",
    ]
