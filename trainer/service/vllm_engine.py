"""One ``vllm serve`` server of the service's vLLM sampler and the sampler of one version on it
(how they answer: :mod:`~envhub.trainer.service.vllm_sampling`).

The server is the service's child process, or, when the models train on Ray (the Megatron
backend), a process that a Ray actor runs on the service's node
(:class:`~envhub.trainer.engines.vllm_ray.PlacedServer`, as ``envhub train`` places its
engines): either way the same calls start, check and stop it."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import math
from pathlib import Path
from typing import Any

import httpx

from envhub.errors import ConfigError, EngineDiedError, EngineError
from envhub.trainer.service.sampling import Turns
from envhub.trainer.service.settings import ServiceSettings
from envhub.trainer.service.wire import Sequence

log = logging.getLogger(__name__)

MAX_LORAS = 4
"""Adapters one engine batch may mix (vLLM's ``--max-loras``); more are swapped in and out."""


class Engine:
    """One vLLM server of a base model, the adapters loaded into it and its turns.

    Args:
        model: The base model's folder (or Hub id), or a full-weight version's folder.
        settings: The service's settings (device, context length, the largest LoRA rank).
        weight_transfer: None: the engine serves LoRA adapters. A weight transfer's name
            (``trainer/weight_sync/transfers``): the engine takes whole new weights through it
            instead (:mod:`~envhub.trainer.service.vllm_full_weights`), without LoRA.
    """

    def __init__(
        self, model: str, settings: ServiceSettings, weight_transfer: str | None = None
    ) -> None:
        from envhub.inference.vllm_server import VLLMServer, default_context_length
        from envhub.trainer.backends.torch_backend import resolve_device
        from envhub.trainer.weight_sync.adapter import engine_lora_rank

        self.model = model
        self.max_rank = engine_lora_rank(settings.vllm_max_lora_rank)
        self.max_model_len = min(settings.context_length, default_context_length(model))
        self.on_gpu = resolve_device(settings.device).type == "cuda"
        # the trainer scores in float32 on a CPU; on GPUs vLLM's bfloat16 kernels
        self.dtype = "bfloat16" if self.on_gpu else "float32"
        args = [
            "--dtype", self.dtype, "--logprobs-mode", "processed_logprobs",
            # unchunked prefills: see the module docstring (seeds)
            "--no-enable-chunked-prefill", "--max-num-batched-tokens", str(self.max_model_len),
        ]  # fmt: skip
        if not self.on_gpu:
            args.append("--enforce-eager")
        extra_args, env = (
            self._lora_flags() if weight_transfer is None else _transfer_flags(weight_transfer)
        )
        server = {
            "model": model,
            "served_model_name": "base",
            "max_model_len": self.max_model_len,
            "extra_args": args + extra_args,
            "env": env,
        }
        self.server: Any = (
            placed_server(server, self.on_gpu) if settings.backend == "megatron"
            else VLLMServer(**server)
        )  # fmt: skip
        """A child of the service, or, beside Megatron ranks, one that Ray places."""
        self.http: httpx.AsyncClient | None = None
        self.turns = Turns()
        self._loaded: dict[Path, tuple[int, str]] = {}
        """Adapter folder -> (its file's mtime, the name it is loaded under)."""
        self._names = itertools.count(1)
        self._loading = asyncio.Lock()
        self.failed = False
        """Set when the server stopped answering: it is restarted even if its process lingers."""

    def _lora_flags(self) -> tuple[list[str], dict[str, str]]:
        """The flags and environment of an engine that loads adapters at run time."""
        args = [
            "--enable-lora", "--max-lora-rank", str(self.max_rank),
            "--max-loras", str(MAX_LORAS), "--max-cpu-loras", str(4 * MAX_LORAS),
        ]  # fmt: skip
        return args, {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}

    def alive(self) -> bool:
        """Whether the server's process runs and answered its last request."""
        process = self.server.process
        return not self.failed and process is not None and process.poll() is None

    async def start(self) -> None:
        """Start the server (minutes on a first start on a CPU) and its client."""
        url = await asyncio.to_thread(self.server.start)
        self.http = httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(600.0, connect=10.0))

    async def adapter(self, folder: Path) -> str:
        """The name the adapter in ``folder`` is loaded under, loading it first if needed (a
        folder saved again under the same name is loaded anew, and its old version dropped).

        Raises:
            ConfigError: Its rank is above the engine's largest.
        """
        stamp = (folder / "adapter_model.safetensors").stat().st_mtime_ns
        async with self._loading:
            known = self._loaded.get(folder)
            if known is not None and known[0] == stamp:
                return known[1]
            rank = json.loads((folder / "adapter_config.json").read_text())["r"]
            if rank > self.max_rank:
                raise ConfigError(
                    f"LoRA rank {rank} is above the vLLM sampler's largest ({self.max_rank}); "
                    "start serve-trainer with a larger --vllm-max-lora-rank"
                )
            name = f"version-{next(self._names)}"
            await self.call("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(folder)})
            if known is not None:
                await self.call("/v1/unload_lora_adapter", {"lora_name": known[1]})
            self._loaded[folder] = (stamp, name)
            return name

    async def forget(self, folder: Path) -> None:
        """Unload the adapter in ``folder`` if it is loaded."""
        async with self._loading:
            known = self._loaded.pop(folder, None)
            if known is None or not self.alive():
                return
            try:
                await self.call("/v1/unload_lora_adapter", {"lora_name": known[1]})
            except EngineDiedError:  # its adapters went with it; the next request replaces it
                log.warning("the vLLM sampler of %s died (its log: %s)", self.model,
                            self.server.log_path)  # fmt: skip

    async def call(self, route: str, body: dict[str, Any]) -> Any:
        """POST ``body`` to ``route``; its JSON (or text) answer.

        Raises:
            EngineError: The server refused or failed it (with its message and log).
        """
        if self.http is None:
            # stopped (a full-weight engine the cap stopped): the caller's retry starts another
            raise EngineDiedError(f"the vLLM sampler of {self.model} is not running")
        try:
            response = await self.http.post(route, json=body)
        except httpx.TransportError as e:
            self.failed = True
            raise EngineDiedError(
                f"the vLLM sampler of {self.model} stopped answering ({type(e).__name__}); "
                f"its log: {self.server.log_path}"
            ) from e
        if response.status_code >= 500 and not await self.healthy():
            self.failed = True
            raise EngineDiedError(
                f"the vLLM sampler of {self.model} died answering {route}; "
                f"its log: {self.server.log_path}"
            )
        if response.status_code != 200:
            raise EngineError(
                f"vLLM answered {route} with HTTP {response.status_code}: "
                f"{response.text[:300]} (log: {self.server.log_path})"
            )
        try:
            return response.json()
        except ValueError:
            return response.text

    async def healthy(self) -> bool:
        """Whether the server says its engine lives (vLLM's ``/health``: 503 once its engine
        core died, which its other routes answer with a bare HTTP 500 until it exits)."""
        assert self.http is not None
        try:
            return (await self.http.get("/health", timeout=10.0)).status_code == 200
        except httpx.TransportError:
            return False

    async def aclose(self) -> None:
        """Close the client and stop the server's whole process group."""
        if self.http is not None:
            await self.http.aclose()
            self.http = None
        await asyncio.to_thread(self.server.stop)


class VLLMSampler:
    """One version (a base model, or an adapter on it) on its engine.

    Args:
        engine: The base model's engine.
        adapter: The name its adapter is loaded under; None: the base model.
    """

    def __init__(self, engine: Engine, adapter: str | None) -> None:
        self.engine = engine
        self.name = adapter or "base"

    async def sample(
        self, prompt: list[int], num_samples: int, params: dict[str, Any]
    ) -> list[Sequence]:
        """``num_samples`` completions of ``prompt`` with Tinker's ``sampling_params``
        (``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop``)."""
        body = self._body(prompt, num_samples, params)
        async with self.engine.turns.shared():
            data = await self.engine.call("/v1/completions", body)
        choices = sorted(data["choices"], key=lambda c: c["index"])
        return [_sequence(c) for c in choices]

    def _body(self, prompt: list[int], num_samples: int, params: dict[str, Any]) -> dict:
        stop = params.get("stop") or []
        stop = [stop] if isinstance(stop, (str, int)) else list(stop)
        room = self.engine.max_model_len - len(prompt)
        if room < 1:
            raise ConfigError(
                f"the prompt has {len(prompt)} tokens; the sampler's context is "
                f"{self.engine.max_model_len}"
            )
        top_k = params.get("top_k")
        body = {
            "model": self.name, "prompt": prompt, "n": num_samples,
            "max_tokens": min(params.get("max_tokens") or 512, room),
            "temperature": params.get("temperature", 1.0), "top_p": params.get("top_p", 1.0),
            "top_k": -1 if top_k is None or top_k < 0 else top_k,
            "stop": [s for s in stop if isinstance(s, str)],
            "stop_token_ids": [s for s in stop if isinstance(s, int)],
            "logprobs": 0, "return_token_ids": True,
        }  # fmt: skip
        if params.get("seed") is not None:
            body["seed"] = params["seed"]
        return body

    async def prompt_logprobs(self, prompt: list[int], last_n: int | None) -> list[float]:
        """Each prompt token's logprob given the tokens before it (NaN for the first, and for
        all but the last ``last_n`` when it is given), with the engine to itself."""
        body = {"model": self.name, "prompt": prompt, "max_tokens": 1, "temperature": 0.0,
                "prompt_logprobs": 0}  # fmt: skip
        async with self.engine.turns.exclusive():
            data = await self.engine.call("/v1/completions", body)
        entries = data["choices"][0]["prompt_logprobs"]
        values = [math.nan] + [
            entry[str(token)]["logprob"]
            for entry, token in zip(entries[1:], prompt[1:], strict=True)
        ]
        if last_n is not None:
            values[: len(values) - last_n] = [math.nan] * (len(values) - last_n)
        return values


SAME_NODE = (
    "the service's vLLM sampler reads saved versions from the service's disk and takes full "
    "weights through shared memory (envhub_shm)"
)
"""Why a Ray-placed sampler engine must run on the service's node."""


def placed_server(server: dict[str, Any], on_gpu: bool) -> Any:
    """A vLLM server with ``server``'s settings that Ray places on the service's node, on a CPU
    of its own and, on GPUs, a GPU of its own (the Megatron models leave it one:
    :func:`~envhub.trainer.service.megatron_training.megatron_config`), as ``envhub train``'s
    ``rollout.vllm.mode: ray`` places a split engine. The service owns Ray
    (:meth:`~envhub.trainer.service.state.ServiceState.start`)."""
    from envhub.trainer.engines.vllm_ray import EngineSlot, PlacedServer

    slot = EngineSlot(num_cpus=1, num_gpus=1 if on_gpu else 0)
    return PlacedServer(server, slot, same_node=SAME_NODE)


def _transfer_flags(transfer: str) -> tuple[list[str], dict[str, str]]:
    """The flags and environment of an engine that takes new weights through ``transfer``
    (vLLM serves its weight-update routes in dev mode only)."""
    from envhub.trainer.weight_sync import transfers

    args = ["--weight-transfer-config", json.dumps({"backend": transfer})]
    return args, {"VLLM_SERVER_DEV_MODE": "1", **transfers.get(transfer).server_env}


def _sequence(choice: dict[str, Any]) -> Sequence:
    tokens = list(choice["token_ids"])
    logprobs = [float(v) for v in choice["logprobs"]["token_logprobs"]]
    return Sequence(tokens, logprobs, "length" if choice["finish_reason"] == "length" else "stop")
