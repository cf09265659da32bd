"""Attention for the torch backend's packed micro-batches, as a transformers attention function.

A packed micro-batch is one ``[1, total]`` row holding its sequences end to end, positions
restarting at 0 in each (``batch.Packing``), so no token is padding. Transformers' own packed
path builds a ``total x total`` block-diagonal mask, which on the CPU makes SDPA attend over the
whole row: its cost grows with the square of the row, not of each sequence. Here each sequence's
slice of the row goes through SDPA on its own (causal, no mask), which is the varlen attention
that flash-attention gives GPUs, written with torch's own kernel.

Given no segment boundaries (``cu_seq_lens_q``), e.g. a right-padded batch or generation with a
KV cache, the function is transformers' ``sdpa`` unchanged, and so is the mask built for it.

On the CPU, 16-bit queries, keys and values (bfloat16 autocast) are attended in float32: torch's
CPU flash-attention backward is ~3x slower in bfloat16 than in float32 at these sizes, and the
float32 result is the more exact one. On other devices they stay in their dtype.
"""

from __future__ import annotations

from typing import Any

import torch

NAME = "envhub_packed_sdpa"
"""The name the function is registered under (``attn_implementation``)."""

_HALF = (torch.bfloat16, torch.float16)


def register() -> str:
    """Register :func:`packed_sdpa` (and transformers' SDPA mask for it) with transformers under
    :data:`NAME`; idempotent. Returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, packed_sdpa)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    return NAME


def packed_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention of ``query [b, heads, T, d]`` over ``key``/``value [b, kv_heads, T, d]``,
    returned as ``[b, T, heads, d]`` like every transformers attention function.

    With ``cu_seq_lens_q`` (``[0, end_0, end_1, ...]`` of a packed ``b = 1`` row) each segment
    attends causally to itself only; without it, transformers' ``sdpa``.
    """
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    # Under autocast the rotated queries and keys arrive in float32 and the values in 16 bits;
    # the output goes back in the 16-bit dtype, where the next projection would cast it anyway.
    out_dtype = next((t.dtype for t in (value, query, key) if t.dtype in _HALF), query.dtype)
    compute = torch.float32 if query.device.type == "cpu" else out_dtype
    query, key, value = query.to(compute), key.to(compute), value.to(compute)
    boundaries = kwargs.pop("cu_seq_lens_q", None)
    for unused in ("cu_seq_lens_k", "max_length_q", "max_length_k"):
        kwargs.pop(unused, None)
    with torch.autocast(query.device.type, enabled=False):
        if boundaries is None:
            out, _ = sdpa_attention_forward(
                module, query, key, value, attention_mask, dropout, scaling, **kwargs
            )
            return out.to(out_dtype), None
        groups = query.shape[1] // key.shape[1]
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
        ends = boundaries.tolist()
        parts = [
            torch.nn.functional.scaled_dot_product_attention(
                query[:, :, start:end],
                key[:, :, start:end],
                value[:, :, start:end],
                dropout_p=dropout,
                scale=scaling,
                is_causal=True,
            )
            for start, end in zip(ends[:-1], ends[1:], strict=True)
        ]
    out = torch.cat(parts, dim=2) if len(parts) > 1 else parts[0]
    return out.transpose(1, 2).contiguous().to(out_dtype), None
