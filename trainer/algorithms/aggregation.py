"""Reduce a ``(B,T)`` token loss to the scalar that is back-propagated, invariant to micro-batching.

A batch is usually split into micro-batches whose gradients are accumulated. If each micro-batch
divided by its own token or sequence count, the result would depend on how the batch was split
(and long sequences would weigh differently in different splits). Here the caller passes the
WHOLE batch's totals (``num_tokens``, ``num_sequences``, summed over micro-batches and, with data
parallelism, over ranks), so the sum of the micro-batch aggregates is the whole batch's aggregate
and so are the accumulated gradients.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from envhub.errors import ConfigError

from ._common import as_bool_mask, masked_sum
from .registry import AGGREGATIONS

Aggregation = Callable[..., Tensor]
"""A loss aggregation's signature (``registry.AGGREGATIONS``): ``(token_loss, mask, *,
num_tokens, num_sequences, norm_length) -> scalar``."""
Count = int | float | Tensor


def _at_least_one(count: Count) -> Count:
    # An empty batch has a zero loss sum; dividing it by 1 keeps it 0 instead of NaN.
    return count.clamp(min=1) if isinstance(count, Tensor) else max(count, 1)


def token_mean(token_loss: Tensor, mask: Tensor, *, num_tokens: Count, **_: object) -> Tensor:
    """Sum of the masked token losses / the whole batch's loss-token count (DAPO's choice)."""
    return masked_sum(token_loss, mask) / _at_least_one(num_tokens)


def seq_mean_token_mean(
    token_loss: Tensor, mask: Tensor, *, num_sequences: Count, **_: object
) -> Tensor:
    """Each sequence's masked token mean, summed, / the whole batch's sequence count (GRPO paper).

    A sequence with no loss token adds 0; count it in ``num_sequences`` or not, consistently.
    """
    lengths = mask.sum(-1).clamp(min=1)
    return (masked_sum(token_loss, mask, dim=-1) / lengths).sum() / _at_least_one(num_sequences)


def seq_mean_token_sum_norm(
    token_loss: Tensor,
    mask: Tensor,
    *,
    num_sequences: Count,
    norm_length: int | None = None,
    **_: object,
) -> Tensor:
    """Masked token-loss sum / (num_sequences * norm_length) (Dr.GRPO's constant normaliser).

    ``norm_length`` is a constant (the configured maximum response length), so no sequence's
    tokens weigh more for being short.
    """
    if norm_length is None or norm_length <= 0:
        raise ConfigError(
            "aggregation 'seq-mean-token-sum-norm' needs norm_length > 0 "
            "(set it to the maximum response length)"
        )
    return masked_sum(token_loss, mask) / (_at_least_one(num_sequences) * norm_length)


def aggregate(
    token_loss: Tensor,
    mask: Tensor,
    mode: str,
    *,
    num_tokens: Count,
    num_sequences: Count,
    norm_length: int | None = None,
) -> Tensor:
    """The scalar loss of one micro-batch, normalised by the whole batch's totals.

    Args:
        token_loss: ``(B,T)`` per-token loss; masked positions may hold anything.
        mask: ``(B,T)`` 1 on tokens that count.
        mode: ``token-mean``, ``seq-mean-token-mean`` or ``seq-mean-token-sum-norm``.
        num_tokens: Loss tokens in the whole batch (all micro-batches, all ranks).
        num_sequences: Sequences in the whole batch.
        norm_length: The constant length for ``seq-mean-token-sum-norm`` (required there).

    Raises:
        ConfigError: Unknown ``mode``, or ``norm_length`` missing where it is needed.
    """
    reduce = AGGREGATIONS.function(mode)
    mask = as_bool_mask(mask, token_loss)
    return reduce(
        token_loss,
        mask,
        num_tokens=num_tokens,
        num_sequences=num_sequences,
        norm_length=norm_length,
    )
