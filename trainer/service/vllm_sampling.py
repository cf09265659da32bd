"""Samplers of the service on vLLM: one engine per base model, each saved LoRA version an
adapter loaded into it by name, and one engine per full-weight training model, its weights
switched to the version sampled (``envhub serve-trainer --sampler vllm``).

The engine is a ``vllm serve`` child process started with envhub's launcher
(:class:`~envhub.inference.vllm_server.VLLMServer`, as ``envhub serve-model`` and the trainer's
engines start theirs; :mod:`~envhub.trainer.service.vllm_engine`): on the first request for its
base model, once, with ``--enable-lora``, and stopped with the service (the launcher's guard
ends its process group when the service's process dies, however it dies); with the Megatron
backend, a Ray actor runs it on the service's node instead, in a bundle of its own
(:func:`~envhub.trainer.service.vllm_engine.placed_server`).
``save_weights_for_sampler`` writes a LoRA model's adapter
(:mod:`~envhub.trainer.service.versions`), and a sampling request on that version loads the
adapter into its base model's engine under a name of its own (vLLM's
``/v1/load_lora_adapter``), so any saved version samples without a new engine; when the
session that sampled it ends, the adapter is unloaded (:meth:`VLLMSamplers.drop`). Weights
saved by a model that trains every weight are served by an engine per training model, started
from the first version sampled; another version's weights are loaded into it through envhub's
weight sync before its requests run, which never share the engine with another version's
(:mod:`~envhub.trainer.service.vllm_full_weights`; at most
``vllm_max_full_weight_engines`` such engines, the least recently used stopped). An engine
that died (its process exited, or it stopped answering: an out-of-memory kill, a vLLM crash)
is replaced on the next request, which loads its adapter again; the request that met the
death is retried once, on the new engine.

Answers as the HF sampler's (:mod:`~envhub.trainer.service.sampling`) do:

- ``num_samples`` rows are one request (vLLM's ``n``); a ``seed`` gives every row its own
  generator (vLLM seeds row ``i`` with ``seed + i``), so a seeded request repeats exactly. The
  engine runs without chunked prefill: a seeded request whose prompt was split across steps
  would crash vLLM's CPU build (its generators have no offset to rewind).
- The sampled tokens' logprobs are vLLM's ``processed_logprobs``: ``log_softmax(logits / T)``,
  as the trainer scores at that temperature; with ``top_p`` / ``top_k`` set they are those of
  the truncated distribution that was sampled (the HF sampler's are not truncated).
- Stop strings and stop token ids end a row in vLLM; the row keeps the token that ended it, as
  it keeps an EOS token.
- Prompt logprobs are vLLM's (``prompt_logprobs``, temperature 1), the first token's NaN. They
  are asked for alone on the engine, no other request in flight: with LoRA enabled, vLLM 0.32
  fails (and its engine dies) when a prompt-logprobs request shares a batch with another.
"""

from __future__ import annotations

import asyncio
import logging

from envhub.errors import ConfigError
from envhub.trainer.service.settings import ServiceSettings
from envhub.trainer.service.versions import Version, adapter_version, holds_weights
from envhub.trainer.service.vllm_engine import MAX_LORAS, Engine, VLLMSampler
from envhub.trainer.service.vllm_full_weights import FullWeightEngines

__all__ = ["MAX_LORAS", "Engine", "VLLMSampler", "VLLMSamplers"]

log = logging.getLogger(__name__)


class VLLMSamplers:
    """The vLLM engines of the service, one per base model, with the same two verbs as
    :class:`~envhub.trainer.service.sampling.Samplers`."""

    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings
        self.engines: dict[str, Engine] = {}
        """The engines started, by base model folder."""
        self.full_weights = FullWeightEngines(settings)
        """The engines of full-weight training models."""
        self._lock = asyncio.Lock()

    def version(self, folder: str) -> Version:
        """What ``folder`` (a sampling session's) samples.

        Raises:
            ConfigError: Neither model weights nor an adapter, or a base model no longer
                served.
        """
        if self._is_base(folder):
            return Version(folder, None)
        version = adapter_version(folder, self.settings)
        if version is not None:
            return version
        if holds_weights(folder):  # a full-weight version
            return Version(folder, None)
        raise ConfigError(f"{folder} holds neither model weights nor a LoRA adapter")

    def _is_base(self, folder: str) -> bool:
        from envhub.trainer.models import resolve_model

        return folder in {resolve_model(model) for model in self.settings.served().values()}

    def full_weights_version(self, folder: str) -> bool:
        """Whether ``folder`` is a version saved by a model that trains every weight."""
        return self.version(folder).adapter is None and not self._is_base(folder)

    async def get(self, folder: str) -> VLLMSampler:
        """The sampler of ``folder``: its base model's engine (started on first use, in a
        worker thread, and again if it died) with its adapter loaded; a full-weight version's:
        its training model's engine, which loads its weights before its requests run."""
        if self.full_weights_version(folder):
            return await self.full_weights.get(folder)
        version = self.version(folder)
        async with self._lock:
            engine = self.engines.get(version.base)
            if engine is not None and not engine.alive():
                log.warning(
                    "the vLLM sampler of %s died (its log: %s); starting a new one, whose "
                    "adapters load again on first use", engine.model, engine.server.log_path
                )  # fmt: skip
                self.engines.pop(version.base)
                await engine.aclose()  # what is left of its process group
                engine = None
            if engine is None:
                engine = Engine(version.base, self.settings)
                self.engines[version.base] = engine  # before it starts: aclose stops it
                try:
                    await engine.start()
                except BaseException:
                    self.engines.pop(version.base, None)
                    await engine.aclose()
                    raise
        name = None if version.adapter is None else await engine.adapter(version.adapter)
        return VLLMSampler(engine, name)

    async def drop(self, folder: str) -> None:
        """Unload ``folder``'s adapter from its engine (its sampling sessions have ended); the
        engine stays for the base model's other versions. A full-weight model's engine stops
        once no session samples its versions."""
        try:
            version = self.version(folder)
        except ConfigError:  # nothing of it was ever loaded
            return
        if self.full_weights_version(folder):
            await self.full_weights.drop(folder)
            return
        engine = self.engines.get(version.base)
        if engine is not None and version.adapter is not None:
            await engine.forget(version.adapter)

    async def aclose(self) -> None:
        """Stop every engine (their whole process groups)."""
        engines, self.engines = list(self.engines.values()), {}
        for engine in engines:
            await engine.aclose()
        await self.full_weights.aclose()
