"""The inference-engine interface the rollout runner (and later the trainer) talks to.

An engine answers one :class:`GenerateRequest` at a time (the runner calls it concurrently).
A request always carries the chat messages and tools; when the engine has a ``tokenizer``, the
runner also fills ``prompt_ids`` and the engine must generate from exactly those tokens and
return the sampled token ids and their logprobs: that is the token-in, token-out path training
needs. Engines without a tokenizer work at the message level (evaluation of hosted models).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from envhub.types import Message, SamplerRef, ToolCall, template_sha256


class SamplingParams(BaseModel):
    """How to sample one assistant turn."""

    model_config = ConfigDict(frozen=True)

    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int | None = None
    max_tokens: int = Field(512, ge=1)
    """Per turn; the runner lowers it to what the episode's token budget and context allow."""
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = True
    """Ask for the sampled tokens' logprobs (needed by the trainer's mismatch correction)."""


class GenerateRequest(BaseModel):
    """One assistant turn to generate."""

    model_config = ConfigDict(frozen=True)

    messages: list[Message]
    tools: list[dict[str, Any]] | None = None
    prompt_ids: list[int] | None = None
    """Token ids of the whole prompt, when the engine generates from tokens."""
    sampling: SamplingParams = SamplingParams()


class Generation(BaseModel):
    """What an engine returns for one request."""

    model_config = ConfigDict(frozen=True)

    text: str
    """Generated text, without the end-of-turn token."""
    token_ids: list[int] | None = None
    """Sampled token ids, including the end-of-turn token when generation stopped on it."""
    logprobs: list[float] | None = None
    """Logprob of each sampled token under the sampling engine."""
    finish_reason: str = "stop"
    """``stop`` (end of turn or stop string) or ``length`` (hit ``max_tokens``)."""
    prompt_token_ids: list[int] | None = None
    """The prompt as the engine tokenised it (chat-level engines that report it)."""
    tool_calls: list[ToolCall] | None = None
    """Calls the server parsed itself (OpenAI-style servers); ``None`` when it returned raw text."""
    weight_version: int | None = None
    """The version of the weights that sampled the first token (engines the trainer updates
    count their updates); ``None`` when the engine does not know."""


@runtime_checkable
class ChatTokenizer(Protocol):
    """Renders a conversation to token ids with the model's chat template."""

    async def render(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
    ) -> list[int]:
        """Token ids of ``messages`` rendered with the chat template."""
        ...

    @property
    def max_length(self) -> int | None:
        """Longest context (prompt + completion) the model accepts, if known."""
        ...


class InferenceEngine(ABC):
    """Base class of inference engines. Subclasses implement :meth:`generate`."""

    tokenizer: ChatTokenizer | None = None
    """Set when the engine generates from token ids; ``None`` for message-level engines."""

    async def start(self) -> None:  # noqa: B027 - an optional hook, empty by default
        """Connect, probe capabilities, warm up. Called once before the first request."""

    @abstractmethod
    async def generate(self, request: GenerateRequest) -> Generation:
        """Generate one assistant turn."""

    async def aclose(self) -> None:  # noqa: B027 - an optional hook, empty by default
        """Release connections and processes."""

    async def describe(self) -> SamplerRef:
        """What samples: engine kind, model, software version and chat template's hash (the
        rollout runner adds its sampling settings and records it on every trajectory). Called
        once per run, after :meth:`start`; keep it cheap. This default names the class and
        hashes the tokenizer's ``chat_template`` when it exposes one."""
        template = getattr(self.tokenizer, "chat_template", None)
        return SamplerRef(
            engine=type(self).__name__, chat_template_sha256=template_sha256(template)
        )

    async def __aenter__(self) -> InferenceEngine:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
