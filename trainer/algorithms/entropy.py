"""Token entropies and selected-token log-probs from logits, without large temporaries.

Vocabularies are big (49k-150k): a ``(B,T,V)`` float32 ``log_softmax`` of a long batch is
gigabytes. Both functions work in float32 whatever the logits' dtype and can go chunk by chunk.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint


def _entropy(logits: Tensor) -> Tensor:
    logp = torch.log_softmax(logits.float(), dim=-1)
    p = logp.exp()
    # -inf logits (a masked vocabulary) have p = 0: their term is 0, not 0 * -inf = NaN.
    return -(p * logp.masked_fill(p == 0, 0.0)).sum(-1)


def token_entropy(logits: Tensor, *, chunk_size: int | None = None) -> Tensor:
    """Entropy of the next-token distribution at every position, ``(B,T,V) -> (B,T)``, float32.

    Args:
        logits: ``(B,T,V)`` logits, any float dtype.
        chunk_size: Positions (along T) per chunk; ``None`` does all at once. Chunking bounds
            the float32 temporaries to ``B*chunk_size*V``; when a gradient is needed each chunk
            is recomputed in the backward pass (activation checkpointing) instead of kept.
    """
    if chunk_size is None or chunk_size >= logits.shape[1]:
        return _entropy(logits)
    needs_grad = torch.is_grad_enabled() and logits.requires_grad
    parts = []
    for chunk in logits.split(chunk_size, dim=1):
        if needs_grad:
            parts.append(checkpoint(_entropy, chunk, use_reentrant=False))
        else:
            parts.append(_entropy(chunk))
    return torch.cat(parts, dim=1)


def selective_log_softmax(logits: Tensor, token_ids: Tensor) -> Tensor:
    """``log_softmax(logits)[..., token_ids]`` without materialising the full log-softmax.

    Computed as ``logit[token] - logsumexp(logits)``. For float32/float64 logits that is done
    in one pass; half-precision logits go row by row in float32, since a half-precision
    logsumexp over a big vocabulary loses the digits that matter.

    Args:
        logits: ``(B,T,V)`` logits.
        token_ids: ``(B,T)`` token ids.

    Returns:
        ``(B,T)`` log-probs of ``token_ids`` (float32, or float64 for float64 logits).
    """
    if logits.dtype in (torch.float32, torch.float64):
        chosen = logits.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)
        return chosen - torch.logsumexp(logits, dim=-1)
    rows = []
    for row_logits, row_ids in zip(logits, token_ids, strict=True):
        row = row_logits.float()
        chosen = row.gather(-1, row_ids.unsqueeze(-1)).squeeze(-1)
        rows.append(chosen - torch.logsumexp(row, dim=-1))
    return torch.stack(rows)
