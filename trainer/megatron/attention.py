"""Causal attention over packed sequences for megatron-core's local layers (no Transformer Engine).

megatron-core's local ``DotProductAttention`` takes no packed sequences: it would need a dense
``[tokens, tokens]`` mask per micro-batch and keeps ``heads x tokens x tokens`` scores per layer
for the backward pass. On one H100 an update of Qwen2.5-0.5B on 4096-token micro-batches peaked
at 59.6 GiB that way, 22.9 GiB with this module. :class:`PackedAttention` runs torch's SDPA
once per sequence of the packed row instead (flash attention on a GPU in bf16/fp16), so a
sequence never attends to its neighbours and nothing quadratic is kept. It is the layer spec's
``core_attention`` wherever the local spec is used (see ``bridge.py``). The worker hands it the
row's sequences as :func:`segment_lengths` in place of the mask; it also takes THD
``PackedSeqParams``, as Transformer Engine's attention does (:func:`packed_seq_params`).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
import torch.nn.functional as F

from envhub.trainer.backends import varlen
from envhub.trainer.batch import Packing, to_device

SEGMENTS = "envhub_segments"
"""The attribute of a ``PackedSeqParams`` that holds the segment lengths as Python ints (read
without a device sync; set by :func:`packed_seq_params`)."""


def segment_lengths(segments: list[int]) -> torch.Tensor:
    """What the worker passes as the attention mask of a packed row to layers that attend with
    :class:`PackedAttention`: the sequences' lengths, a CPU tensor. Passed this way, and not as
    THD ``packed_seq_params``, rotary embeddings take the row's positions in one go (RoPE is
    relative: a sequence scores the same at any offset) instead of megatron-core's loop over
    sequences, which reads the boundaries back from the GPU in every layer; and, being a
    tensor argument, it reaches the layers again when they are recomputed."""
    return torch.tensor(segments, dtype=torch.int64)


def packed_seq_params(packing: Packing, device: torch.device) -> Any:
    """megatron-core's THD ``PackedSeqParams`` for ``packing``'s row, on ``device``, with the
    segment lengths also kept as ints for :class:`PackedAttention`."""
    from megatron.core.packed_seq_params import PackedSeqParams

    bounds = to_device(packing.cu_seqlens(), device)
    longest = max(packing.segments)
    params = PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=bounds,
        cu_seqlens_kv=bounds,
        max_seqlen_q=longest,
        max_seqlen_kv=longest,
    )
    setattr(params, SEGMENTS, tuple(packing.segments))
    return params


class PackedAttention(torch.nn.Module):
    """Drop-in ``core_attention`` for megatron-core's self-attention: the same constructor and
    ``forward`` arguments as its ``DotProductAttention``, causal attention within each packed
    sequence. Without packed parameters the whole input is one causal sequence per batch row."""

    def __init__(
        self,
        config: Any,
        layer_number: int,
        attn_mask_type: Any,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: Any = None,
        **_: Any,
    ) -> None:
        super().__init__()
        from envhub.errors import ConfigError

        if getattr(config, "context_parallel_size", 1) != 1:
            raise ConfigError("context parallelism needs Transformer Engine's attention")
        if getattr(config, "window_size", None) is not None:
            raise ConfigError("sliding-window attention needs Transformer Engine's attention")
        self.config = config
        head_dim = config.kv_channels
        self.scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout

    # Never compiled: compiled layers (``backend.compile.layers``) run it as it is, so that the
    # row's segment lengths, which differ in every micro-batch, are not baked into the compiled
    # code (one recompilation per layout).
    @torch.compiler.disable
    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: Any = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: Any = None,
    ) -> torch.Tensor:
        """Causal attention within each sequence of a packed row.

        The row's sequences come either as THD ``packed_seq_params`` (``query`` ``[t, heads,
        d]``, ``key``/``value`` ``[t, groups, d]``; returns ``[t, heads * d]``) or as
        ``attention_mask`` holding :func:`segment_lengths` (``[s, 1, heads, d]`` in,
        ``[s, 1, heads * d]`` out). With neither, each batch row of ``[s, b, heads, d]`` is one
        sequence."""
        if attention_bias is not None:
            raise ValueError("PackedAttention takes no attention bias")
        if packed_seq_params is not None:
            return self._attend_packed(query, key, value, getattr(packed_seq_params, SEGMENTS))
        if attention_mask is not None:
            segments = attention_mask.tolist()  # a CPU tensor: no device sync
            row = self._attend_packed(query[:, 0], key[:, 0], value[:, 0], segments)
            return row.unsqueeze(1)
        out = self._attend(*(t.permute(1, 2, 0, 3) for t in (query, key, value)))
        return out.permute(2, 0, 1, 3).flatten(2)

    def _attend_packed(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, segments: list[int]
    ) -> torch.Tensor:
        """``[t, heads, d]`` queries, ``[t, groups, d]`` keys and values of a row of
        ``segments`` (lengths) -> ``[t, heads * d]``: in one varlen kernel call where it runs
        (a GPU, 16-bit), else one SDPA call per sequence."""
        dropout = self.dropout if self.training else 0.0
        if len(segments) > 1 and varlen.runs(query, dropout):
            plan = varlen.plan_on(tuple(segments), query.device)
            return varlen.attend_tokens(query, key, value, plan, self.scale).flatten(1)
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (query, key, value))  # [1, h, t, d]
        k, v = _share_groups(k, v, q.shape[1])  # once per row, not per sequence
        if len(segments) == 1:
            out = self._attend(q, k, v)
        else:
            parts, start = [], 0
            for length in segments:
                window = slice(start, start + length)
                parts.append(self._attend(q[:, :, window], k[:, :, window], v[:, :, window]))
                start += length
            out = torch.cat(parts, dim=2)
        return out[0].transpose(0, 1).flatten(1)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention of ``[b, heads, s, d]`` queries on ``[b, groups, s, d]`` keys and
        values (each group shared by ``heads / groups`` query heads)."""
        k, v = _share_groups(k, v, q.shape[1])
        dropout = self.dropout if self.training else 0.0
        with _dropout_rng() if dropout else contextlib.nullcontext():
            return F.scaled_dot_product_attention(
                q, k, v, dropout_p=dropout, is_causal=True, scale=self.scale
            )


def _share_groups(
    k: torch.Tensor, v: torch.Tensor, heads: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[b, groups, s, d]`` keys and values repeated to ``heads`` (query head ``h`` reads
    group ``h // (heads / groups)``, as megatron-core's and HF's attention do)."""
    if k.shape[1] == heads:
        return k, v
    repeats = heads // k.shape[1]
    return k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)


def _dropout_rng() -> Any:
    """megatron-core's model-parallel RNG region, as its own attention drops out in (each tensor
    rank holds other heads, so each draws its own mask)."""
    from megatron.core import tensor_parallel

    return tensor_parallel.get_cuda_rng_tracker().fork()
