"""Generation with the trainer's own ``transformers`` model, in the training process.

:class:`HFEngine` samples with the very module the trainer optimises (colocated, no copy), so
there are no weights to synchronise: :meth:`HFEngine.update_weights` only counts versions.

- **Batching.** The rollout runner calls :meth:`~HFEngine.generate` for many episodes at once.
  Requests wait ``batch_wait_s`` on a queue, are grouped by sampling parameters (all but
  ``max_tokens``) and each group runs as one left-padded ``model.generate`` call, in a worker
  thread so the event loop keeps stepping envs meanwhile. A batch generates up to its largest
  ``max_tokens``; a row stops as soon as it reaches its own limit or an EOS token.
- **Tokens.** Generation starts from exactly ``request.prompt_ids``. ``token_ids`` include the
  EOS token when the turn ended on one; ``text`` is their decoding without it, special tokens
  kept, so the text re-tokenises to the sampled ids in the next turn's prompt.
- **Stop strings** are applied after generation: the turn is cut at the token that completes
  the first stop string (finish ``stop``). Unlike vLLM's default, the text keeps the stop
  string (and whatever else that last token holds), so that text and ``token_ids`` agree.
- **Logprobs** are those of the sampled tokens under ``log_softmax(raw_logits / T)`` (``T = 1``
  for greedy): the temperature-scaled distribution the trainer recomputes from its own forward
  pass, *not* the one renormalised by top-p / top-k. The raw logits are read step by step from
  the model's output (a forward hook) instead of with ``output_logits=True``, which would keep
  steps x batch x vocab floats (6 GB for 64 rows x 512 tokens x 49k vocab).
- **Seeds.** Each ``generate`` call seeds torch's RNG from (engine seed, call counter[, request
  seed]) inside :func:`torch.random.fork_rng`, so the trainer's own RNG stream is untouched and
  the same requests batched the same way sample the same tokens. A batch's rows are put in
  prompt order, not arrival order (which follows the timing of the env calls before each
  request), so which row gets which draw does not follow timing. A row's draw still depends on
  its batch, so where the batches themselves follow timing (env replies racing the batch window
  in multi-turn rollouts) a rerun can differ. :meth:`~HFEngine.state_dict` checkpoints the
  counter.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from envhub.errors import ConfigError, EngineError
from envhub.inference.base import GenerateRequest, Generation, SamplingParams
from envhub.trainer.engines.base import RolloutEngine, SamplingState
from envhub.trainer.engines.hf_tokenizer import HFChatTokenizer
from envhub.types import SamplerRef, template_sha256

if TYPE_CHECKING:
    from envhub.trainer.backends.base import TrainBackend

__all__ = ["HFEngine"]

# Neutral values for the sampling knobs a model's generation_config may set (repetition penalty,
# min_p, ...): transformers fills every knob left unset from it, and they would change the
# distribution away from the one the trainer recomputes.
_NEUTRAL = {
    "repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "min_new_tokens": 0,
}


@dataclass
class _Pending:
    prompt_ids: list[int]
    sampling: SamplingParams
    future: asyncio.Future[Generation]
    rendered: bool
    """True when the engine rendered the prompt itself (it is then reported back)."""


@dataclass
class _RawBatch:
    """What one ``model.generate`` call produced, before rows are cut and decoded."""

    tokens: list[list[int]]
    logprobs: list[list[float]]


class HFEngine(RolloutEngine):
    """Generates with a ``transformers`` causal LM that the trainer trains in the same process.

    Args:
        model: The policy (a ``PreTrainedModel``, or a PEFT model wrapping one). It is used as
            it is, never moved or copied; generation switches it to eval mode and back.
        tokenizer: Its ``transformers`` tokenizer (chat template, EOS and pad tokens).
        max_batch_size: Most rows in one ``generate`` call.
        batch_wait_s: How long the first request of a batch waits for others to join it.
        seed: Engine seed; with the call counter it seeds every ``generate`` call.
        device: Where the inputs go; defaults to the device of the model's parameters.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 64,
        batch_wait_s: float = 0.005,
        seed: int = 0,
        device: str | torch.device | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be at least 1, got {max_batch_size}")
        if batch_wait_s < 0:
            raise ConfigError(f"batch_wait_s must not be negative, got {batch_wait_s}")
        self.model = model
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.seed = seed
        self.device = (
            torch.device(device) if device is not None else next(model.parameters()).device
        )
        config = getattr(model, "config", None)
        self.tokenizer: HFChatTokenizer = HFChatTokenizer(
            tokenizer,
            max_length=getattr(config, "max_position_embeddings", None),
            generation_config=getattr(model, "generation_config", None),
        )
        if not self.tokenizer.eos_token_ids:
            raise ConfigError(
                "the model has no EOS token (generation_config or tokenizer); set one"
            )
        self.calls = 0
        """``generate`` calls made so far; with ``seed`` it seeds the next call (checkpointed)."""
        self.weights_version = 0
        """Bumped by :meth:`update_weights` after each optimizer step."""
        self.reset_stats()
        self._queue: asyncio.Queue[_Pending | None] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        name = type(self.model).__name__
        return f"HFEngine({name}, device={self.device}, max_batch_size={self.max_batch_size})"

    # -- the public API -------------------------------------------------------------------------

    async def generate(self, request: GenerateRequest) -> Generation:
        """Generate one assistant turn from ``request.prompt_ids`` (rendered from the messages
        with the chat template when ``None``)."""
        rendered = request.prompt_ids is None
        prompt_ids = list(request.prompt_ids) if request.prompt_ids is not None else None
        if prompt_ids is None:
            prompt_ids = await self.tokenizer.render(request.messages, request.tools, True)
        self._check_prompt(prompt_ids)
        future: asyncio.Future[Generation] = asyncio.get_running_loop().create_future()
        self._ensure_worker().put_nowait(_Pending(prompt_ids, request.sampling, future, rendered))
        return await future

    async def update_weights(
        self, backend: TrainBackend | None = None, version: int | None = None
    ) -> None:
        """Note that the policy changed. The engine samples with the trainer's module itself, so
        the new weights are already in place: nothing is copied and ``backend`` is not read.
        Only :attr:`weights_version` moves (to ``version``, or by one), for recording which
        policy sampled each turn."""
        self.weights_version = self.weights_version + 1 if version is None else version

    async def describe(self) -> SamplerRef:
        """``hf``: the model's name or path, the transformers version, the template's hash."""
        import transformers

        config = getattr(self.model, "config", None)
        return SamplerRef(
            engine="hf",
            model=getattr(config, "_name_or_path", None) or None,
            version=transformers.__version__,
            chat_template_sha256=template_sha256(self.tokenizer.chat_template),
        )

    async def aclose(self) -> None:
        """Finish the requests already queued, then stop the batching task."""
        worker, queue = self._worker, self._queue
        self._worker = self._queue = self._loop = None
        if worker is None or queue is None or worker.done():
            return
        if worker.get_loop() is not asyncio.get_running_loop():
            worker.cancel()  # its loop is gone or elsewhere; nothing of it can be awaited here
            return
        queue.put_nowait(None)
        await worker

    def state_dict(self) -> dict[str, Any]:
        """The sampling state to checkpoint (:class:`SamplingState`: the call counter that seeds
        each batch)."""
        return SamplingState(self.calls).to_json()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s counter, so a resumed run samples as the original did."""
        self.calls = SamplingState.from_json(state).calls

    def reset_stats(self) -> None:
        """Zero the counters that :meth:`stats` reports (e.g. once per training step)."""
        self.last_batch_sizes: list[int] = []
        """Rows of each ``generate`` call since the last reset."""
        self.generated_tokens = 0
        self.generate_seconds = 0.0

    def stats(self) -> dict[str, float]:
        """Throughput since the last :meth:`reset_stats`, for the trainer's metrics."""
        calls = len(self.last_batch_sizes)
        return {
            "generated_tokens": float(self.generated_tokens),
            "generate_seconds": self.generate_seconds,
            "generate_calls": float(calls),
            "mean_batch_size": sum(self.last_batch_sizes) / calls if calls else 0.0,
            "tokens_per_second": self.generated_tokens / self.generate_seconds
            if self.generate_seconds
            else 0.0,
        }

    # -- batching -------------------------------------------------------------------------------

    def _check_prompt(self, prompt_ids: list[int]) -> None:
        if not prompt_ids:
            raise EngineError("the prompt is empty; render the conversation with engine.tokenizer")
        limit = self.tokenizer.max_length
        if limit is not None and len(prompt_ids) >= limit:
            raise EngineError(
                f"the prompt has {len(prompt_ids)} tokens, the model takes at most {limit}: "
                "shorten the conversation or lower the env's token budget"
            )

    def _ensure_worker(self) -> asyncio.Queue[_Pending | None]:
        """The queue of this event loop's batching task, started on first use (an engine
        outlives event loops: each ``asyncio.run`` gets its own task)."""
        loop = asyncio.get_running_loop()
        if (
            self._queue is None
            or self._worker is None
            or self._worker.done()
            or self._loop is not loop
        ):
            self._queue, self._loop = asyncio.Queue(), loop
            self._worker = loop.create_task(self._serve(self._queue), name="hf-engine-batcher")
        return self._queue

    async def _serve(self, queue: asyncio.Queue[_Pending | None]) -> None:
        stop = False
        while not stop:
            first = await queue.get()
            if first is None:
                return
            if self.batch_wait_s:
                await asyncio.sleep(self.batch_wait_s)
            pending = [first]
            while not queue.empty():
                item = queue.get_nowait()
                if item is None:
                    stop = True  # serve what came before the close, then stop
                else:
                    pending.append(item)
            pending.sort(key=_row_order)
            try:
                for batch in _batches(pending, self.max_batch_size, self.tokenizer.max_length):
                    await self._run(batch)
            except BaseException as e:  # never leave a request waiting on a dead batcher
                _fail(pending, EngineError(f"the HF engine's batching task stopped: {e!r}"))
                raise

    async def _run(self, batch: list[_Pending]) -> None:
        batch = [p for p in batch if not p.future.done()]  # requests cancelled while waiting
        if not batch:
            return
        sampling = batch[0].sampling
        seed = self._next_seed(sampling)
        limits = [p.sampling.max_tokens for p in batch]
        started = time.perf_counter()
        try:
            raw = await asyncio.to_thread(
                self._generate, [p.prompt_ids for p in batch], limits, sampling, seed
            )
            results = [
                self._finish(t, lp, n, sampling)
                for t, lp, n in zip(raw.tokens, raw.logprobs, limits, strict=True)
            ]
        except Exception as e:
            error = EngineError(
                f"HF generate failed on a batch of {len(batch)}: {type(e).__name__}: {e}"
            )
            error.__cause__ = e
            return _fail(batch, error)
        self.generate_seconds += time.perf_counter() - started
        self.last_batch_sizes.append(len(batch))
        for p, result in zip(batch, results, strict=True):
            self.generated_tokens += len(result.token_ids or ())
            if p.rendered:
                result = result.model_copy(update={"prompt_token_ids": p.prompt_ids})
            if not p.future.done():
                p.future.set_result(result)

    def _next_seed(self, sampling: SamplingParams) -> int:
        entropy = [self.seed, self.calls] + ([sampling.seed] if sampling.seed is not None else [])
        self.calls += 1
        return int(np.random.SeedSequence(entropy).generate_state(1)[0])

    # -- one generate call (worker thread) ------------------------------------------------------

    def _generate(
        self, prompts: list[list[int]], limits: list[int], sampling: SamplingParams, seed: int
    ) -> _RawBatch:
        pad = self.tokenizer.pad_token_id
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):  # left padding: every row's next token is at the end
            ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            mask[row, width - len(prompt) :] = 1
        temperature = sampling.temperature if sampling.temperature > 0 else 1.0
        recorder = _Recorder(width, torch.tensor(limits, device=self.device), temperature)
        target = (
            self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        )
        hook = target.register_forward_hook(recorder.capture)
        was_training = self.model.training
        # no_grad rather than inference_mode: buffers a model creates while generating (e.g.
        # rotary caches) would otherwise become inference tensors that break the next backward.
        try:
            self.model.eval()
            with (
                torch.no_grad(),
                torch.random.fork_rng(
                    devices=_rng_devices(self.device), device_type=self.device.type
                ),
            ):
                torch.manual_seed(seed)
                out = self.model.generate(
                    input_ids=ids.to(self.device),
                    attention_mask=mask.to(self.device),
                    max_new_tokens=_new_tokens(width, max(limits), self.tokenizer.max_length),
                    stopping_criteria=StoppingCriteriaList([recorder]),
                    pad_token_id=pad,
                    eos_token_id=list(self.tokenizer.eos_token_ids),
                    use_cache=True,
                    **_sampling_kwargs(sampling, getattr(self.model, "generation_config", None)),
                )
        finally:
            hook.remove()
            self.model.train(was_training)
        return _RawBatch(out[:, width:].tolist(), recorder.logprobs())

    def _finish(
        self, tokens: list[int], logprobs: list[float], limit: int, sampling: SamplingParams
    ) -> Generation:
        """Cut one row at its EOS / own limit / first stop string and decode it."""
        tokens = tokens[:limit]
        eos = next((i for i, t in enumerate(tokens) if t in self.tokenizer.eos_token_ids), None)
        finish = "length"
        if eos is not None:
            tokens, finish = tokens[: eos + 1], "stop"
        body = tokens[:-1] if finish == "stop" else tokens
        text = self.tokenizer.decode(body)
        if sampling.stop and any(s in text for s in sampling.stop):
            cut = self.tokenizer.stop_cut(body, sampling.stop)
            tokens, finish = body[:cut], "stop"
            text = self.tokenizer.decode(tokens)
        return Generation(
            text=text,
            token_ids=tokens,
            logprobs=logprobs[: len(tokens)] if sampling.logprobs else None,
            finish_reason=finish,
            weight_version=self.weights_version,  # the module itself: always the newest
        )


class _Recorder(StoppingCriteria):
    """Logprob of each sampled token from the raw logits, and each row's own token limit.

    ``capture`` (a forward hook) keeps the last position's raw logits of each forward pass;
    the stopping check, which transformers calls right after appending the sampled tokens,
    scores those tokens against them. Only one step of logits is alive at a time.
    """

    def __init__(self, width: int, limits: torch.Tensor, temperature: float) -> None:
        self.width, self.limits, self.temperature = width, limits, temperature
        self._logits: torch.Tensor | None = None
        self._steps: list[torch.Tensor] = []

    def capture(self, module: Any, args: Any, output: Any) -> None:
        # A copy, so the whole prefill logits tensor it may be a view of is not kept alive.
        self._logits = output.logits[:, -1, :].to(dtype=torch.float32, copy=True)

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        if self._logits is None:
            raise EngineError("the model's forward returned no logits to score the sampled tokens")
        scaled = torch.log_softmax(self._logits / self.temperature, dim=-1)
        self._steps.append(scaled.gather(1, input_ids[:, -1:]).squeeze(1))
        self._logits = None
        return (input_ids.shape[1] - self.width) >= self.limits

    def logprobs(self) -> list[list[float]]:
        if not self._steps:
            return []
        return torch.stack(self._steps, dim=1).tolist()


def _row_order(p: _Pending) -> tuple[list[int], int]:
    """Where a request's row goes in a batch: by prompt, so that a rerun's arrival order (which
    follows timing) does not change which row gets which of the batch's random draws."""
    return p.prompt_ids, p.sampling.max_tokens


def _batches(pending: list[_Pending], size: int, context: int | None) -> list[list[_Pending]]:
    """Group requests whose sampling differs only in ``max_tokens``, in the given order, and split
    each group into batches of at most ``size`` rows that fit the context: every row of a batch
    advances to the longest prompt plus the largest ``max_tokens``, and positions past the
    model's limit would break models with learned position embeddings."""
    groups: dict[SamplingParams, list[_Pending]] = {}
    for p in pending:
        groups.setdefault(p.sampling.model_copy(update={"max_tokens": 1}), []).append(p)
    batches: list[list[_Pending]] = []
    for group in groups.values():
        batch: list[_Pending] = []
        for p in group:
            rows = [*batch, p]
            span = max(len(r.prompt_ids) for r in rows) + max(r.sampling.max_tokens for r in rows)
            if batch and (len(rows) > size or (context is not None and span > context)):
                batches.append(batch)
                rows = [p]
            batch = rows
        batches.append(batch)
    return batches


def _sampling_kwargs(s: SamplingParams, model_config: Any) -> dict[str, Any]:
    if s.temperature == 0:  # greedy: the warpers do not apply
        return {"do_sample": False, **_NEUTRAL}
    kwargs = {
        "do_sample": True,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k or 0,  # 0 switches top-k off; None would take the model's default
        **_NEUTRAL,
    }
    if getattr(model_config, "min_p", None) is not None:
        kwargs["min_p"] = 0.0  # None would take the model's value; 0 keeps every token
    return kwargs


def _new_tokens(width: int, wanted: int, context: int | None) -> int:
    """``wanted``, unless the context ends first (a request asking for more than fits)."""
    return wanted if context is None else max(1, min(wanted, context - width))


def _fail(pending: list[_Pending], error: Exception) -> None:
    for p in pending:
        if not p.future.done():
            p.future.set_exception(error)


def _rng_devices(device: torch.device) -> list[Any]:
    """Accelerator devices whose RNG ``fork_rng`` must save and restore (none on the CPU)."""
    if device.type == "cpu":
        return []
    return [
        device.index if device.index is not None else getattr(torch, device.type).current_device()
    ]
