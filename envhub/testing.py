"""Tools for testing envs without a model, and trainers without a trained one: scripted
policies, a byte-level tokenizer, and an env whose reward even a random model varies on.

A *policy* is a deterministic function ``(messages, tools) -> str`` that writes the next
assistant turn. :class:`ScriptedEngine` wraps one as an inference engine, so the real rollout
runner drives real envs with it. With a :class:`ByteChatTokenizer` it also produces token ids,
which exercises the token-level path (masks, prefix checks) exactly as a model would.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from envhub.env import SingleTurnEnv
from envhub.inference.base import GenerateRequest, Generation, InferenceEngine
from envhub.rewards.rubric import Rubric, reward
from envhub.types import Message, SamplerRef

Policy = Callable[[list[Message], list[dict[str, Any]] | None], str]


def replay(*responses: str) -> Policy:
    """A policy that answers turn k with ``responses[k]`` (the last one repeats)."""
    if not responses:
        raise ValueError("replay() needs at least one response")

    def policy(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
        turn = sum(m.role == "assistant" for m in messages)
        return responses[min(turn, len(responses) - 1)]

    return policy


def null_policy(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
    """Always answers with an empty turn: every env should score it at its floor."""
    return ""


class ByteChatTokenizer:
    """A ChatML tokenizer over UTF-8 bytes: ids 0-255 are bytes, then special tokens.

    Deterministic, dependency-free and exactly invertible, like a real tokenizer for the
    purposes of the token contract. Tools are rendered into the first system message.
    """

    IM_START, IM_END = 256, 257
    eos_token_id = IM_END
    _SPECIAL = {IM_START: "<|im_start|>", IM_END: "<|im_end|>"}

    def __init__(self, max_length: int | None = None) -> None:
        self._max_length = max_length

    @property
    def max_length(self) -> int | None:
        """The context length given at construction (``None``: unlimited)."""
        return self._max_length

    def encode(self, text: str) -> list[int]:
        """The UTF-8 bytes of ``text`` as ids (no special tokens)."""
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``: bytes decoded as UTF-8 (invalid ones replaced), special ids by name.

        Ids above the special tokens decode to nothing.
        """
        out, buffer = [], bytearray()
        for i in ids:
            if i < 256:
                buffer.append(i)
                continue
            out.append(buffer.decode("utf-8", errors="replace"))
            buffer = bytearray()
            out.append(self._SPECIAL.get(i, ""))
        out.append(buffer.decode("utf-8", errors="replace"))
        return "".join(out)

    def render_sync(
        self,
        messages: Sequence[Message],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
    ) -> list[int]:
        """Token ids of ``messages`` in ChatML: ``<|im_start|>role\\ncontent<|im_end|>\\n`` each.

        ``tools`` go into the system message as JSON lines under ``# Tools`` (appended to the
        first message if it is a system message, else in a new one put first);
        ``add_generation_prompt`` appends ``<|im_start|>assistant\\n``.
        """
        ids: list[int] = []
        rendered = list(messages)
        if tools:
            block = "# Tools\n" + "\n".join(json.dumps(t, sort_keys=True) for t in tools)
            if rendered and rendered[0].role == "system":
                rendered[0] = rendered[0].model_copy(
                    update={"content": f"{rendered[0].content}\n\n{block}"}
                )
            else:
                rendered.insert(0, Message(role="system", content=block))
        for m in rendered:
            ids += [
                self.IM_START,
                *self.encode(f"{m.role}\n{m.content or ''}"),
                self.IM_END,
                *self.encode("\n"),
            ]
        if add_generation_prompt:
            ids += [self.IM_START, *self.encode("assistant\n")]
        return ids

    async def render(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
    ) -> list[int]:
        """:meth:`render_sync` behind the async ``render`` of the ``ChatTokenizer`` protocol."""
        return self.render_sync(messages, tools, add_generation_prompt)


class ScriptedEngine(InferenceEngine):
    """An engine whose turns come from a deterministic policy.

    Args:
        policy: Writes each assistant turn from the conversation so far.
        tokenizer: When given, the engine works at the token level: it returns the turn's token
            ids (ending with ``tokenizer.eos_token_id``) and logprob 0 for each.
    """

    def __init__(self, policy: Policy, tokenizer: ByteChatTokenizer | None = None) -> None:
        self.policy = policy
        self.tokenizer = tokenizer
        self.requests = 0

    async def describe(self) -> SamplerRef:
        """``scripted``, with the policy's qualified name as the model."""
        name = getattr(self.policy, "__qualname__", None) or type(self.policy).__name__
        return SamplerRef(engine="scripted", model=name)

    async def generate(self, request: GenerateRequest) -> Generation:
        """The policy's turn for ``request.messages``, counted in ``self.requests``.

        With a tokenizer, the turn's ids end with the end-of-turn token and are cut to
        ``sampling.max_tokens`` (then ``finish_reason`` is ``"length"``).
        """
        self.requests += 1
        text = self.policy(list(request.messages), request.tools)
        if self.tokenizer is None:
            return Generation(text=text)
        ids = self.tokenizer.encode(text) + [self.tokenizer.eos_token_id]
        limit = request.sampling.max_tokens
        if len(ids) > limit:
            ids = ids[:limit]
            return Generation(
                text=self.tokenizer.decode(ids),
                token_ids=ids,
                logprobs=[0.0] * limit,
                finish_reason="length",
            )
        return Generation(text=text, token_ids=ids, logprobs=[0.0] * len(ids))


@reward
def letter_e_share(response: str) -> float:
    """The share of the letter ``e`` in the reply."""
    return response.count("e") / max(len(response), 1)


class LetterEnv(SingleTurnEnv):
    """Write anything; more ``e`` is better (reward: :func:`letter_e_share`).

    The reward is continuous, so the samples of even a random model differ and every GRPO
    group has signal: a trainer test on a tiny random model really updates the weights.
    Not registered; tests register it as ``LetterEnv.name``.
    """

    name = "test-letters"
    version = "0.0.1"

    def load_dataset(self) -> list[dict[str, Any]]:
        """Six prompts that differ only by number; no reference answers."""
        return [{"question": f"Write a word ({i}).", "answer": ""} for i in range(6)]

    def default_rubric(self) -> Rubric:
        """One reward: :func:`letter_e_share`."""
        return Rubric([letter_e_share])
