"""Samplers of the service: one saved version of a model's weights behind envhub's HF engine.

A sampler is the weights folder that ``save_weights_for_sampler`` wrote (or a base model's),
loaded once into its own ``transformers`` model and driven by
:class:`~envhub.trainer.engines.hf.HFEngine` (batching, seeds, logprobs of the sampled tokens
under ``log_softmax(logits / temperature)``). Training goes on in another module, so a
sampler's weights are the version that was saved, whatever the trainer has done since.
The few most recently used samplers stay loaded.

Tinker's ``stop`` may list token ids as well as strings: the engine stops on the model's EOS
tokens and on stop strings; stop token ids cut the completion after generation, at the first
one (it is kept, as an EOS token is), which changes nothing but the wasted tokens.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

from envhub.inference.base import GenerateRequest, SamplingParams
from envhub.trainer.service.wire import Sequence


class Sampler:
    """Generates from the HF model folder ``folder``, on ``device``."""

    def __init__(self, folder: str, device: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from envhub.trainer.backends.torch_backend import resolve_device
        from envhub.trainer.engines.hf import HFEngine

        self.folder = folder
        target = resolve_device(device)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(target)
        self.engine = HFEngine(model.eval(), tokenizer, seed=0)

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
        if sampling.seed is not None and num_samples > 1:
            # one seed for the request, a different draw per sample
            requests = [
                request.model_copy(update={"sampling": sampling.model_copy(
                    update={"seed": sampling.seed + i})})
                for i in range(num_samples)
            ]  # fmt: skip
        else:
            requests = [request] * num_samples
        generations = await asyncio.gather(*(self.engine.generate(r) for r in requests))
        return [_cut(g.token_ids or [], g.logprobs or [], g.finish_reason, tokens)
                for g in generations]  # fmt: skip


def _cut(tokens: list[int], logprobs: list[float], finish: str, stops: set[int]) -> Sequence:
    at = next((i for i, t in enumerate(tokens) if t in stops), None)
    if at is None:
        return Sequence(tokens, logprobs, "stop" if finish == "stop" else "length")
    return Sequence(tokens[: at + 1], logprobs[: at + 1], "stop")


class Samplers:
    """The loaded samplers by folder, the ``keep`` most recently used."""

    def __init__(self, device: str, keep: int = 2) -> None:
        self.device = device
        self.keep = keep
        self._loaded: OrderedDict[str, Sampler] = OrderedDict()
        self._lock = asyncio.Lock()

    async def get(self, folder: str) -> Sampler:
        """The sampler of ``folder``, loaded (in a worker thread) on first use."""
        async with self._lock:
            sampler = self._loaded.pop(folder, None)
            if sampler is None:
                sampler = await asyncio.to_thread(Sampler, folder, self.device)
            self._loaded[folder] = sampler
            while len(self._loaded) > self.keep:
                _, old = self._loaded.popitem(last=False)
                await old.engine.aclose()
            return sampler

    async def aclose(self) -> None:
        """Stop every loaded sampler's engine."""
        for sampler in self._loaded.values():
            await sampler.engine.aclose()
        self._loaded.clear()
