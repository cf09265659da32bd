"""The token-level record of a multi-turn episode: ids exactly as sampled, loss mask, logprobs.

After each env reply the conversation is re-rendered with the chat template. When the tokens
recorded so far are an exact prefix of that rendering, the rest of it (the template's closing
of the assistant turn, the env's messages, the next generation prompt) is appended with mask 0.

When they are not (the template rewrote an earlier turn, or the sampled text re-tokenises
differently) that is *drift*: it is recorded on the trajectory, and the episode continues from
the tokens as sampled, with the closing and the env's messages rendered against a fixed dummy
conversation. Training therefore never sees re-tokenised policy tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from envhub.inference.base import ChatTokenizer
from envhub.types import Message, assistant, user

_DUMMY = [user("x"), assistant("y")]


def common_prefix_length(a: list[int], b: list[int]) -> int:
    """Number of leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass
class TokenTrace:
    """Accumulates ``token_ids`` / ``loss_mask`` / ``sampler_logprobs`` of one episode."""

    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt_length: int = 0
    drift: list[dict[str, Any]] = field(default_factory=list)
    closing: list[int] | None = None
    """The template's tokens after an assistant turn, once drift has made them needed."""
    valid: bool = True
    """False once the record can no longer be token-exact (chat-level engines after drift)."""

    def start(self, prompt_ids: list[int]) -> None:
        """Begin the record with the prompt's tokens (mask 0, logprob 0.0), replacing any before."""
        self.ids, self.mask, self.logprobs = (
            list(prompt_ids),
            [0] * len(prompt_ids),
            [0.0] * len(prompt_ids),
        )
        self.prompt_length = len(prompt_ids)

    def add_sampled(self, token_ids: list[int], logprobs: list[float] | None) -> None:
        """Append tokens the policy sampled (mask 1) with their logprobs (0.0 when not given)."""
        self.ids.extend(token_ids)
        self.mask.extend([1] * len(token_ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(token_ids))

    def add_context(self, token_ids: list[int]) -> None:
        """Append tokens the policy did not sample (template, env replies): mask 0, logprob 0.0."""
        self.ids.extend(token_ids)
        self.mask.extend([0] * len(token_ids))
        self.logprobs.extend([0.0] * len(token_ids))

    def trim_to_last_sampled(self) -> None:
        """Drop context after the last sampled token (an env reply that will never be answered,
        e.g. when the episode is cut for lack of context). A record without sampled tokens is
        left as it is."""
        if 1 not in self.mask:
            return
        end = len(self.mask) - self.mask[::-1].index(1)
        del self.ids[end:], self.mask[end:], self.logprobs[end:]

    def extend_to(self, full_prompt: list[int], turn: int) -> bool:
        """Extend to ``full_prompt`` (the prompt of turn ``turn``) if the record is its exact
        prefix; else record drift."""
        if full_prompt[: len(self.ids)] == self.ids:
            self.add_context(full_prompt[len(self.ids) :])
            return True
        at = common_prefix_length(self.ids, full_prompt)
        self.drift.append(
            {
                "turn": turn,
                "position": at,
                "recorded": self.ids[at : at + 8],
                "rendered": full_prompt[at : at + 8],
            }
        )
        return False


async def append_env_turn(
    trace: TokenTrace,
    tokenizer: ChatTokenizer,
    messages: list[Message],
    new_messages: list[Message],
    tools: list[dict[str, Any]] | None,
    turn: int,
    stopped_on_eos: bool,
) -> None:
    """Append the env's reply and the next generation prompt to ``trace`` (see module doc).

    Drift is recorded once per episode: after the first, the record can no longer be a prefix
    of any rendering, and every later turn goes straight to the dummy-conversation path."""
    if not trace.drift:
        full = await tokenizer.render(messages, tools, add_generation_prompt=True)
        if trace.extend_to(full, turn):
            return
    if trace.closing is None:  # same tokenizer and tools all episode: render the dummy once
        trace.closing = await _turn_closing(tokenizer, tools)
    closing = trace.closing
    if stopped_on_eos and closing and trace.ids and closing[0] == trace.ids[-1]:
        closing = closing[1:]
    trace.add_context(closing + await _env_part(tokenizer, new_messages, tools))


async def _turn_closing(tokenizer: ChatTokenizer, tools: list[dict[str, Any]] | None) -> list[int]:
    """Tokens the template writes after an assistant turn's text (e.g. ``<|im_end|>\\n``)."""
    opened = await tokenizer.render(_DUMMY[:1], tools, add_generation_prompt=True)
    closed = await tokenizer.render(_DUMMY, tools, add_generation_prompt=False)
    if closed[: len(opened)] != opened:
        return []
    return closed[len(opened) + 1 :]  # skip the single token of the dummy text "y"


async def _env_part(
    tokenizer: ChatTokenizer, new_messages: list[Message], tools: list[dict[str, Any]] | None
) -> list[int]:
    base = await tokenizer.render(_DUMMY, tools, add_generation_prompt=False)
    full = await tokenizer.render([*_DUMMY, *new_messages], tools, add_generation_prompt=True)
    return full[common_prefix_length(base, full) :]
