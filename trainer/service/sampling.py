"""Samplers of the service: one saved version of a model's weights behind envhub's HF engine.

A sampler is one saved version (:mod:`~envhub.trainer.service.versions`) loaded once into its
own ``transformers`` model and driven by :class:`~envhub.trainer.engines.hf.HFEngine`
(batching, seeds, logprobs of the sampled tokens under ``log_softmax(logits / temperature)``):
a LoRA version is its base model's folder with the saved adapter merged into the weights
(:func:`load_model`, the sum the trainer's export computes), a full-weight version, an old
merged one or a base model is its folder as it is. Training goes on in another module, so a
sampler's weights are the version that was saved, whatever the trainer has done since. The few
most recently used samplers stay loaded; a session's go when it ends (:meth:`Samplers.drop`).

A request with a ``seed`` samples on an engine of its own seeded with it, so the same seed
gives the same tokens on every call (Tinker's promise; the shared engine mixes its call counter
into each batch's seed, as ``envhub train``'s rollouts want). Its ``num_samples`` rows go as one
batch, each row its own draw. An engine reads the logits through a hook on the model's forward
while it generates, so a seeded engine takes the model alone: requests on the shared engine
share it (and batch together), a seeded one waits for them and they for it.

Prompt logprobs (``compute_logprobs``) are those of one forward pass over the prompt under
``log_softmax(logits)``, temperature 1, as envhub's trainer scores a sequence; the first token
has none (NaN on the wire, ``None`` in the SDK). That pass runs the decoder and the head, not
the model's own forward, so no engine's hook sees it.

Tinker's ``stop`` may list token ids as well as strings: the engine stops on the model's EOS
tokens and on stop strings; stop token ids cut the completion after generation, at the first
one (it is kept, as an EOS token is), which changes nothing but the wasted tokens.
"""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from envhub.inference.base import GenerateRequest, SamplingParams
from envhub.trainer.service.settings import ServiceSettings
from envhub.trainer.service.versions import folder_stamp, hf_version
from envhub.trainer.service.wire import Sequence


def load_model(folder: str, adapter: Path | None = None) -> Any:
    """The float32 ``transformers`` model in HF folder ``folder``, with the LoRA ``adapter``
    (PEFT's format) merged into it when given.

    PEFT's merge adds ``get_delta_weight`` (scaled ``B @ A``) to each adapted weight in place,
    the same float32 sum the trainer's export (``hf_weights``) computes out of place, so the
    merged model holds exactly the weights a merged save held.
    """
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    if adapter is None:
        return model
    from peft import PeftModel

    return PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()


class Sampler:
    """Generates from the HF model folder ``folder`` (its tokenizer too), with ``adapter``
    merged into its weights when given, on ``device``."""

    def __init__(self, folder: str, device: str, adapter: Path | None = None) -> None:
        from transformers import AutoTokenizer

        from envhub.trainer.backends.torch_backend import resolve_device
        from envhub.trainer.engines.hf import HFEngine

        self.folder, self.adapter = folder, adapter
        tokenizer = AutoTokenizer.from_pretrained(folder)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        model = load_model(folder, adapter).to(resolve_device(device))
        self.model, self.tokenizer = model.eval(), tokenizer
        self.engine = HFEngine(self.model, tokenizer, seed=0)
        self.stamp: tuple[int, int] | None = None
        """The sampling folder's :func:`folder_stamp` when this was loaded from it."""
        self.turns = Turns()

    async def sample(
        self, prompt: list[int], num_samples: int, params: dict[str, Any]
    ) -> list[Sequence]:
        """``num_samples`` completions of ``prompt`` (batched by the engine) with Tinker's
        ``sampling_params`` (``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``seed``,
        ``stop``)."""
        stop = params.get("stop") or []
        stop = [stop] if isinstance(stop, (str, int)) else list(stop)
        strings = tuple(s for s in stop if isinstance(s, str))
        tokens = {s for s in stop if isinstance(s, int)}
        top_k = params.get("top_k", -1)
        sampling = SamplingParams(
            temperature=params.get("temperature", 1.0),
            top_p=params.get("top_p", 1.0),
            top_k=None if top_k is None or top_k < 0 else top_k,
            max_tokens=params.get("max_tokens") or 512,
            stop=strings,
            seed=params.get("seed"),
        )
        request = GenerateRequest(messages=[], prompt_ids=prompt, sampling=sampling)
        generations = await self._generate(request, num_samples)
        return [_cut(g.token_ids or [], g.logprobs or [], g.finish_reason, tokens)
                for g in generations]  # fmt: skip

    async def _generate(self, request: GenerateRequest, num_samples: int) -> list[Any]:
        """``num_samples`` generations of ``request``: on the shared engine, or, with a seed,
        as one batch on an engine seeded with it alone (the same seed, the same tokens)."""
        seed = request.sampling.seed
        if seed is None:
            async with self.turns.shared():
                return await asyncio.gather(*(self.engine.generate(request)
                                              for _ in range(num_samples)))  # fmt: skip
        from envhub.trainer.engines.hf import HFEngine

        engine = HFEngine(self.model, self.tokenizer, seed=seed, max_batch_size=num_samples)
        async with self.turns.exclusive():
            try:
                return await asyncio.gather(*(engine.generate(request)
                                              for _ in range(num_samples)))  # fmt: skip
            finally:
                await engine.aclose()

    async def prompt_logprobs(self, prompt: list[int], last_n: int | None) -> list[float]:
        """Each prompt token's logprob given the tokens before it (NaN for the first, and for
        all but the last ``last_n`` when it is given), in a worker thread."""
        return await asyncio.to_thread(self._prompt_logprobs, prompt, last_n)

    def _prompt_logprobs(self, prompt: list[int], last_n: int | None) -> list[float]:
        import torch

        device = next(self.model.parameters()).device
        with torch.no_grad():
            hidden = self.model.get_decoder()(torch.tensor([prompt], device=device))[0]
            logits = self.model.get_output_embeddings()(hidden[0, :-1]).float()
            scores = torch.log_softmax(logits, dim=-1)
            picked = scores.gather(1, torch.tensor(prompt[1:], device=device)[:, None])[:, 0]
        values = [math.nan] + picked.cpu().tolist()
        if last_n is not None:
            values[: len(values) - last_n] = [math.nan] * (len(values) - last_n)
        return values


class Turns:
    """Turns on one model: shared ones (the shared engine's requests, which it batches) or an
    exclusive one (a seeded engine's); see the module docstring."""

    def __init__(self) -> None:
        self._changed = asyncio.Condition()
        self._sharing = 0
        self._alone = False

    @asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        """Hold a shared turn: wait while an exclusive one is held."""
        async with self._changed:
            await self._changed.wait_for(lambda: not self._alone)
            self._sharing += 1
        try:
            yield
        finally:
            async with self._changed:
                self._sharing -= 1
                self._changed.notify_all()

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """Hold the model alone: wait until no turn is held."""
        async with self._changed:
            await self._changed.wait_for(lambda: not self._alone and not self._sharing)
            self._alone = True
        try:
            yield
        finally:
            async with self._changed:
                self._alone = False
                self._changed.notify_all()


def _cut(tokens: list[int], logprobs: list[float], finish: str, stops: set[int]) -> Sequence:
    at = next((i for i, t in enumerate(tokens) if t in stops), None)
    if at is None:
        return Sequence(tokens, logprobs, "stop" if finish == "stop" else "length")
    return Sequence(tokens[: at + 1], logprobs[: at + 1], "stop")


class Samplers:
    """The loaded samplers by sampling session folder, the ``keep`` most recently used."""

    def __init__(self, settings: ServiceSettings, keep: int = 2) -> None:
        self.settings = settings
        self.keep = keep
        self._loaded: OrderedDict[str, Sampler] = OrderedDict()
        self._lock = asyncio.Lock()

    async def get(self, folder: str) -> Sampler:
        """The sampler of ``folder``, loaded (in a worker thread) on first use.

        Raises:
            ConfigError: ``folder`` holds no version the sampler loads.
        """
        async with self._lock:
            sampler = self._loaded.pop(folder, None)
            stamp = folder_stamp(folder)
            if sampler is not None and sampler.stamp != stamp:  # saved again under its name
                await sampler.engine.aclose()
                sampler = None
            if sampler is None:
                version = hf_version(folder, self.settings)
                sampler = await asyncio.to_thread(
                    Sampler, version.base, self.settings.device, version.adapter
                )
                sampler.stamp = stamp
            self._loaded[folder] = sampler
            while len(self._loaded) > self.keep:
                _, old = self._loaded.popitem(last=False)
                await old.engine.aclose()
            return sampler

    async def drop(self, folder: str) -> None:
        """Unload ``folder``'s sampler, if loaded (its sampling sessions have ended)."""
        async with self._lock:
            sampler = self._loaded.pop(folder, None)
        if sampler is not None:
            await sampler.engine.aclose()

    async def aclose(self) -> None:
        """Stop every loaded sampler's engine."""
        for sampler in self._loaded.values():
            await sampler.engine.aclose()
        self._loaded.clear()
