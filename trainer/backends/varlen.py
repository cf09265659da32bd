"""A packed row's attention in one kernel call on GPUs: torch's ``varlen_attn``.

On the CPU a packed row attends segment by segment (:mod:`packed_attention`): one SDPA call per
segment and layer, which on a GPU is a storm of small launches (the padded layout was 7.4x
faster there). ``torch.nn.attention.varlen.varlen_attn`` (torch >= 2.10, flash-attention's
varlen kernels, CUDA only) attends every segment of the row in one call, given the cumulative
query and key lengths.

A segment after a shared prompt attends to the prompt's keys and causally to its own. Its keys
are gathered as ``[prompt, own]`` (one ``index_select`` per layer) and the kernel's causal mask,
aligned to the bottom right when a segment has more keys than queries, lets query ``i`` see the
whole prompt and its own ``0..i``: exactly :class:`Segment`'s mask.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import torch

_HALF = (torch.bfloat16, torch.float16)


class Segment(NamedTuple):
    """A run of the packed row that attends causally to itself, after a shared prompt's keys
    when ``prompt_length`` > 0. Both attention paths take it (defined here, below
    :mod:`packed_attention`, which re-exports it)."""

    start: int
    length: int
    prompt_start: int = 0
    prompt_length: int = 0
    mask: torch.Tensor | None = None
    """``[length, prompt_length + length]``, True where a query may look (set with a prompt)."""


@dataclass(frozen=True)
class VarlenPlan:
    """A packed row's segments as the kernel takes them (built on the host, once per row)."""

    cu_queries: torch.Tensor
    """``[S + 1]`` int32: where each segment's queries begin in the row, then the row's end."""
    cu_keys: torch.Tensor
    """``[S + 1]`` int32: the same for the gathered keys."""
    max_queries: int
    max_keys: int
    key_index: torch.Tensor | None
    """``[sum of keys]`` the row position of each gathered key; ``None`` when no segment has a
    shared prompt (the keys are the row's, as they are)."""

    @classmethod
    def of(cls, segments: Sequence[Segment]) -> VarlenPlan:
        """The plan of a row whose ``segments`` tile it in order."""
        queries = [s.length for s in segments]
        keys = [s.prompt_length + s.length for s in segments]
        index = None
        if any(s.prompt_length for s in segments):
            parts = [
                part
                for s in segments
                for part in (
                    torch.arange(s.prompt_start, s.prompt_start + s.prompt_length),
                    torch.arange(s.start, s.start + s.length),
                )
            ]
            index = torch.cat(parts)
        return cls(_cumulative(queries), _cumulative(keys), max(queries), max(keys), index)

    @classmethod
    def of_lengths(cls, lengths: Sequence[int]) -> VarlenPlan:
        """The plan of a row of sequences of ``lengths``, each attending causally to itself."""
        bounds = _cumulative(list(lengths))
        return cls(bounds, bounds, max(lengths), max(lengths), None)

    def to(self, device: torch.device | str) -> VarlenPlan:
        """A copy with its tensors on ``device``."""
        move = {"non_blocking": True}
        index = self.key_index.to(device, **move) if self.key_index is not None else None
        return replace(
            self,
            cu_queries=self.cu_queries.to(device, **move),
            cu_keys=self.cu_keys.to(device, **move),
            key_index=index,
        )


def _cumulative(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32)


def available() -> bool:
    """Whether this torch has ``varlen_attn`` (and so a CUDA build that can run it)."""
    return _kernel() is not None


def runs(query: torch.Tensor, dropout: float) -> bool:
    """Whether the kernel takes this attention: a CUDA device, 16-bit inputs, no dropout, and a
    torch that has ``varlen_attn``."""
    return query.is_cuda and query.dtype in _HALF and dropout == 0.0 and _kernel() is not None


def attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    plan: VarlenPlan,
    scale: float | None,
) -> torch.Tensor:
    """``query [1, heads, T, d]`` over ``key``/``value [1, kv_heads, T, d]`` as ``plan``'s
    segments say; returns ``[1, T, heads, d]`` (a transformers attention function's layout)."""
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [T, heads, d]
    return attend_tokens(q, k, v, plan, scale)[None]


def attend_tokens(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    plan: VarlenPlan,
    scale: float | None,
) -> torch.Tensor:
    """``query [T, heads, d]`` over ``key``/``value [T, kv_heads, d]`` as ``plan``'s segments
    say; returns ``[T, heads, d]``. Check :func:`runs` first."""
    kernel = _kernel()
    assert kernel is not None, "check runs() first"
    if plan.key_index is not None:
        key, value = key.index_select(0, plan.key_index), value.index_select(0, plan.key_index)
    return kernel(
        query.contiguous(),
        key.contiguous(),
        value.contiguous(),
        plan.cu_queries,
        plan.cu_keys,
        plan.max_queries,
        plan.max_keys,
        scale=scale,
    )


@functools.lru_cache(maxsize=8)
def plan_on(lengths: tuple[int, ...], device: torch.device) -> VarlenPlan:
    """:meth:`VarlenPlan.of_lengths` on ``device``, kept for the next layers of the same row
    (each would otherwise copy the same boundaries to the device again)."""
    return VarlenPlan.of_lengths(lengths).to(device)


@functools.cache
def _kernel() -> Callable[..., torch.Tensor] | None:
    """torch's ``varlen_attn``, causal, grouped-query heads allowed; ``None`` before torch 2.10.

    torch 2.10 takes ``is_causal``; later ones a ``window_size`` whose ``(-1, 0)`` is causal.
    Where it has no ``enable_gqa`` the grouped keys and values are repeated first."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    parameters = inspect.signature(varlen_attn).parameters
    causal: dict[str, Any] = (
        {"window_size": (-1, 0)} if "window_size" in parameters else {"is_causal": True}
    )
    if "enable_gqa" in parameters:
        return functools.partial(varlen_attn, enable_gqa=True, **causal)

    def repeated(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any, **kw: Any):
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        return varlen_attn(q, k, v, *args, **kw, **causal)

    return repeated
