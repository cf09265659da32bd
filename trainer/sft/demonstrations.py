"""Demonstrations as token records of the policy's chat template, and the batch of each step.

Every conversation of the run's ``sft.sources`` is rendered with the policy's tokenizer by
:func:`~envhub.rollout.conversation.render_conversation`: the assistant turns' tokens are the
ones trained on, and a conversation the template cannot render as one growing record (it
rewrites an earlier turn) is left out and reported with where it broke, never trained on.

The batches are a pure function of the run's seed and the position in the stream: epoch ``e``
visits the demonstrations in a permutation seeded by ``(seed, e)``, and the ``k``-th batch of
``size`` takes positions ``k x size`` onwards, across epochs. A resumed run therefore trains on
the same demonstrations at the same steps with nothing saved in its checkpoint.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from envhub.errors import ConfigError
from envhub.inference.base import ChatTokenizer
from envhub.rollout.conversation import render_conversation
from envhub.trainer.sft.config import SFTConfig
from envhub.trainer.sft.sources import Conversation, SourceResult, load_source

if TYPE_CHECKING:
    from envhub.trainer.config import TrainConfig

_EPOCH_SEED = 1_000_003
"""Mixes the epoch into the permutation's seed."""


@dataclass(frozen=True)
class Demonstration:
    """One conversation as the policy's tokens."""

    token_ids: list[int]
    loss_mask: list[int]
    """1 on the assistant turns' tokens."""
    origin: str


@dataclass
class Demonstrations:
    """The run's demonstrations and how they were obtained."""

    items: list[Demonstration]
    sources: list[SourceResult] = field(default_factory=list)
    drifted: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    """``(origin, drift)`` of each conversation left out because the template broke the
    prefix rule."""
    too_long: int = 0
    """Conversations left out for being longer than the model's context."""
    seed: int = 0

    def __len__(self) -> int:
        return len(self.items)

    @property
    def trained_tokens(self) -> int:
        """Tokens in the loss over all demonstrations."""
        return sum(sum(d.loss_mask) for d in self.items)

    def batch(self, index: int, size: int, start: int = 0) -> list[Demonstration]:
        """The ``index``-th batch of ``size`` demonstrations after position ``start`` of the
        stream (see the module doc)."""
        first = start + index * size
        return [self.at(position) for position in range(first, first + size)]

    def at(self, position: int) -> Demonstration:
        """The demonstration at ``position`` of the stream of seeded epochs."""
        epoch, offset = divmod(position, len(self.items))
        return self.items[self._order(epoch)[offset]]

    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.items)))
        random.Random(self.seed * _EPOCH_SEED + epoch).shuffle(order)
        return order

    def steps_for(self, epochs: float, batch_size: int) -> int:
        """Updates that pass over the demonstrations ``epochs`` times."""
        return max(1, math.ceil(epochs * len(self.items) / batch_size))

    def describe(self) -> str:
        """The run header's line: how many, from where, what was left out."""
        parts = [
            f"{len(self.items)} demonstrations ({self.trained_tokens:,} trained tokens) from "
            + "; ".join(s.describe() for s in self.sources)
        ]
        if self.drifted:
            origin, drift = self.drifted[0]
            parts.append(
                f"{len(self.drifted)} left out: the chat template re-renders an earlier turn "
                f"(first: {origin}, turn {drift.get('turn')}, token {drift.get('position')}; "
                "`envhub doctor` shows the template's drift)"
            )
        if self.too_long:
            parts.append(f"{self.too_long} left out: longer than the model's context")
        return "; ".join(parts)


async def load_demonstrations(
    config: SFTConfig,
    tokenizer: ChatTokenizer,
    end_ids: Sequence[int],
    seed: int = 0,
) -> Demonstrations:
    """Every source's conversations, rendered with ``tokenizer`` (see the module doc).

    Args:
        config: The ``sft:`` section (its sources).
        tokenizer: The policy's chat tokenizer.
        end_ids: The ids that end an assistant turn.
        seed: The run's seed: plays the reference policies and orders the batches.

    Raises:
        ConfigError: A source cannot be read, or no demonstration is left to train on.
    """
    results = [await load_source(source, seed) for source in config.sources]
    demos = Demonstrations([], results, seed=seed)
    limit = tokenizer.max_length
    for conversation in (c for r in results for c in r.conversations):
        rendered = await render_conversation(
            tokenizer, conversation.messages, conversation.tools, end_ids
        )
        if not rendered.ok:
            assert rendered.drift is not None
            demos.drifted.append((conversation.origin, rendered.drift))
        elif limit is not None and len(rendered.token_ids) > limit:
            demos.too_long += 1
        else:
            demos.items.append(_demonstration(rendered.token_ids, rendered.loss_mask, conversation))
    if not demos.items:
        raise ConfigError(f"sft: no demonstration to train on: {demos.describe()}")
    return demos


def _demonstration(ids: list[int], mask: list[int], conversation: Conversation) -> Demonstration:
    return Demonstration(ids, mask, conversation.origin)


async def load_for_run(config: TrainConfig) -> Demonstrations | None:
    """The run's demonstrations (``None`` without ``sft:``), rendered with its policy's chat
    tokenizer, loaded before any model or engine so that a bad source fails at once."""
    if config.sft is None:
        return None
    from envhub.trainer.engines.hf_tokenizer import policy_chat_tokenizer
    from envhub.trainer.models import resolve_model

    tokenizer = policy_chat_tokenizer(resolve_model(config.model.name))
    return await load_demonstrations(config.sft, tokenizer, tokenizer.eos_token_ids, config.seed)


def with_sft_steps(config: TrainConfig, demos: Demonstrations | None) -> TrainConfig:
    """``config`` with ``sft.epochs`` over ``demos`` as the ``sft.steps`` they make (the same
    config when the steps were given), so that the run's ``config.json`` says how many."""
    if config.sft is None or config.sft.steps is not None or demos is None:
        return config
    assert config.sft.epochs is not None
    steps = demos.steps_for(config.sft.epochs, config.sft.batch_size)
    sft = config.sft.model_copy(update={"steps": steps, "epochs": None})
    return config.model_copy(update={"sft": sft})
