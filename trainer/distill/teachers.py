"""Teachers: each scores token sequences, the logprob of every token after the first.

    ServerTeacher   an OpenAI-compatible server's prompt logprobs (vLLM's ``prompt_logprobs``)
    LocalTeacher    a checkpoint loaded beside the trainer (HF transformers, no gradients)
    PolicyTeacher   the policy itself, through its backend (self-distillation)

All score at temperature 1 (the teacher's own distribution). Distillation compares the logprobs
of the same token ids on both sides, so a teacher whose tokenizer differs from the policy's is
refused when the run starts, with the first token the two read differently.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

from envhub.errors import ConfigError, EngineError

PROBE_TEXT = "The teacher's tokenizer: 12 + 345 = 357, ça va? 日本語 <|im_end|>\n\tdone."
"""What the tokenizer check scores: words, digits, accents, CJK, a special token, whitespace."""


class Teacher(Protocol):
    """What distillation needs from a teacher."""

    async def start(self, tokenizer: Any) -> None:
        """Connect or load; check the teacher reads ``tokenizer``'s ids as the policy does.

        Raises:
            ConfigError: Another tokenizer (the message names a token read differently).
        """
        ...

    async def logprobs(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """Each sequence's logprob of every token after the first (``len - 1`` values)."""
        ...

    def describe(self) -> str:
        """Who the teacher is (the run header)."""
        ...

    async def aclose(self) -> None:
        """Release connections and memory."""
        ...


class ServerTeacher:
    """Scores through ``POST /v1/completions`` with ``prompt_logprobs: 0`` and the token ids as
    the prompt (vLLM's OpenAI server; ``envhub serve-model`` serves a checkpoint so).

    Args:
        url: The server's base URL, with or without ``/v1``.
        model: The served model's name; default: the first the server lists.
        api_key: A bearer token for the server, if it wants one.
        max_concurrency: Requests in flight at once.
        timeout: Seconds one request may take.
    """

    def __init__(
        self,
        url: str,
        model: str | None = None,
        api_key: str | None = None,
        max_concurrency: int = 16,
        timeout: float = 300.0,
    ) -> None:
        self.root = url.rstrip("/").removesuffix("/v1")
        self.model = model
        self.api_key = api_key
        self.timeout = timeout
        self._limit = asyncio.Semaphore(max_concurrency)
        self._client: Any = None

    def describe(self) -> str:
        """``MODEL at URL``."""
        return f"{self.model} at {self.root}"

    async def start(self, tokenizer: Any) -> None:
        """Connect, check the server serves the model (the first it lists when none is
        named), and check its tokenizer by scoring :data:`PROBE_TEXT` (each token comes back
        with the server's text of it)."""
        import httpx

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self._client = httpx.AsyncClient(base_url=self.root, headers=headers, timeout=self.timeout)
        served = [m["id"] for m in (await self._call("GET", "/v1/models")).get("data", [])]
        if self.model is None and served:
            self.model = served[0]
        if self.model not in served:
            raise ConfigError(
                f"the teacher server at {self.root} serves {', '.join(served) or 'no model'}, "
                f"not {self.model!r}: set distill.teacher.model to one of them"
            )
        ids = tokenizer.encode(PROBE_TEXT, add_special_tokens=False)
        entries = await self._prompt_logprobs(ids)
        for token, entry in zip(ids[1:], entries, strict=True):
            theirs = entry.get("decoded_token")
            ours = {tokenizer.decode([token]), tokenizer.convert_ids_to_tokens(token)}
            # A token holding part of a character has no text of its own: each side shows it
            # its own way (vLLM: '', transformers: U+FFFD), so only whole ones are compared.
            partial = any("\ufffd" in text for text in ours) or not theirs
            if not partial and theirs not in ours:
                raise ConfigError(_other_tokenizer(self.describe(), token, theirs, ours))

    async def logprobs(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """The server's prompt logprobs of each sequence, requests in parallel."""
        entries = await asyncio.gather(*(self._prompt_logprobs(list(s)) for s in sequences))
        return [[e["logprob"] for e in each] for each in entries]

    async def _prompt_logprobs(self, ids: list[int]) -> list[dict[str, Any]]:
        """The entry of each token after the first: ``{"logprob", "decoded_token", ...}``."""
        body = {
            "model": self.model,
            "prompt": ids,
            "max_tokens": 1,
            "temperature": 1.0,
            "prompt_logprobs": 0,
        }
        async with self._limit:
            data = await self._call("POST", "/v1/completions", body)
        listed = data["choices"][0].get("prompt_logprobs")
        if listed is None or len(listed) != len(ids):
            raise EngineError(
                f"the teacher at {self.root} returned no prompt logprobs: it must be an "
                "OpenAI-compatible server that takes `prompt_logprobs` (vLLM does)"
            )
        return [entry[str(token)] for entry, token in zip(listed[1:], ids[1:], strict=True)]

    async def _call(self, method: str, path: str, body: Any = None) -> Any:
        import httpx

        try:
            response = await self._client.request(method, path, json=body)
        except httpx.HTTPError as e:
            raise EngineError(f"the teacher at {self.root} cannot be reached: {e}") from None
        if response.status_code >= 400:
            raise EngineError(
                f"the teacher at {self.root} answered {path} with {response.status_code}: "
                f"{response.text[:300]}"
            )
        return response.json()

    async def aclose(self) -> None:
        """Close the HTTP client."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def _other_tokenizer(teacher: str, token: int, theirs: str, ours: set[str]) -> str:
    return (
        f"the teacher ({teacher}) does not use the policy's tokenizer: it reads token {token} "
        f"as {theirs!r}, the policy as {sorted(ours)[0]!r}. Distillation compares the logprobs "
        "of the same token ids, so the teacher must share the policy's tokenizer (the same "
        "model family and vocabulary)"
    )


class LocalTeacher:
    """A checkpoint in this process, on ``device``, scoring without gradients.

    Args:
        model: An HF folder, id or alias (resolved as ``model.name`` is).
        device: Where to put it (the policy's device).
        micro_batch_tokens: Padded tokens per forward pass.
    """

    def __init__(self, model: str, device: Any, micro_batch_tokens: int = 4096) -> None:
        self.name = model
        self.device = device
        self.micro_batch_tokens = micro_batch_tokens
        self.model: Any = None

    def describe(self) -> str:
        """``MODEL (beside the trainer)``."""
        return f"{self.name} (beside the trainer)"

    async def start(self, tokenizer: Any) -> None:
        """Load the checkpoint; refuse one whose vocabulary differs from the policy's."""
        await asyncio.to_thread(self.load, tokenizer)

    def load(self, tokenizer: Any) -> None:
        """:meth:`start` in the calling thread."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from envhub.trainer.models import resolve_model

        path = resolve_model(self.name)
        theirs = AutoTokenizer.from_pretrained(path)
        if theirs.get_vocab() != tokenizer.get_vocab():
            differing = _first_difference(theirs.get_vocab(), tokenizer.get_vocab())
            raise ConfigError(
                _other_tokenizer(self.describe(), differing, *_names(theirs, tokenizer, differing))
            )
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        self.model = model.to(self.device).eval().requires_grad_(False)

    async def logprobs(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """Forward passes over padded micro-batches, in a worker thread."""
        return await asyncio.to_thread(self.score, sequences)

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """:meth:`logprobs` in the calling thread."""
        import torch

        from envhub.trainer.algorithms import selective_log_softmax
        from envhub.trainer.backends.torch_backend import place_for, placed_logits
        from envhub.trainer.batch import micro_batches

        out: list[list[float]] = [[] for _ in sequences]
        with torch.no_grad():
            for mb in micro_batches(full_mask_batch(sequences), self.micro_batch_tokens, 0):
                placed = place_for(self.model, mb, packed=False)
                logits = placed_logits(self.model, placed).float()
                picked = selective_log_softmax(logits[None], placed.tokens[None])[0]
                if placed.targets is not None:
                    picked = placed.targets.spread(picked)
                for row, index in enumerate(mb.samples):
                    out[index] = picked[row, : len(sequences[index]) - 1].cpu().tolist()
        return out

    async def aclose(self) -> None:
        """Drop the model."""
        self.model = None


def _first_difference(a: dict[str, int], b: dict[str, int]) -> int:
    """The smallest id that the two vocabularies name differently."""
    names_a, names_b = {v: k for k, v in a.items()}, {v: k for k, v in b.items()}
    return min(i for i in set(names_a) | set(names_b) if names_a.get(i) != names_b.get(i))


def _names(theirs: Any, ours: Any, token: int) -> tuple[str, set[str]]:
    def name(tokenizer: Any) -> str:
        return str(tokenizer.convert_ids_to_tokens(token)) if token < len(tokenizer) else "(none)"

    return name(theirs), {name(ours)}


class PolicyTeacher:
    """The policy, scored through its backend (both backends' ``logprobs``): the teacher of
    self-distillation, which differs from the student by what it is shown."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def describe(self) -> str:
        """``the policy itself``."""
        return "the policy itself"

    async def start(self, tokenizer: Any) -> None:
        """Nothing to check: the policy's tokenizer is the policy's."""

    async def logprobs(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """The backend's logprobs at temperature 1, in a worker thread."""
        return await asyncio.to_thread(self._score, sequences)

    def _score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        batch = full_mask_batch(sequences)
        batches = self.backend.micro_batches(batch)
        scored = self.backend.logprobs(batches, temperature=1.0)
        out: list[list[float]] = [[] for _ in sequences]
        for mb, values in zip(batches, scored, strict=True):
            for row, index in enumerate(mb.samples):
                out[index] = values[row, : len(sequences[index]) - 1].tolist()
        return out

    async def aclose(self) -> None:
        """Nothing to release: the backend is the run's."""


def full_mask_batch(sequences: Sequence[Sequence[int]]) -> Any:
    """Sequences as a batch whose every token after the first is scored."""
    from envhub.trainer.batch import Batch, Sample

    return Batch(
        [Sample(list(s), [1] * len(s), [0.0] * len(s), 0.0, i) for i, s in enumerate(sequences)]
    )
