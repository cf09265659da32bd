"""Packed micro-batches for the torch backend: the row layout and its transformers attention
function.

A packed micro-batch runs as one ``[1, total]`` row holding its sequences end to end, so no
token is padding. Sequences that begin with the same prompt (a GRPO group's samples, the first
turn of multi-turn episodes) share it: the prompt runs once, followed by each sequence's own
rest, which attends to the shared prompt and causally to itself, at the positions it has in the
whole sequence. Every hidden state is the one the sequence would get alone (the same keys at the
same positions), so logprobs and gradients are the unpacked ones, and a group of ``k`` samples
with a ``P``-token prompt runs ``(k - 1) * P`` fewer tokens.

Transformers' own packed path builds a ``total x total`` block mask, over which CPU SDPA attends
to the whole row. Here, on GPUs, the whole row goes through torch's varlen flash-attention kernel
in one call (:mod:`varlen`); elsewhere each :class:`Segment` goes through SDPA on its own
(causal, or with the shared prompt's keys in front). Without segments (a right-padded batch,
generation with a KV cache) the function is transformers' ``sdpa`` unchanged, and so is the mask
built for it.

On the CPU, 16-bit queries, keys and values (bfloat16 autocast) are attended in float32: torch's
CPU flash-attention backward is slower in bfloat16 than in float32 at these sizes, and the
float32 result is the more exact one. On other devices they stay in their dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from envhub.trainer.backends import varlen
from envhub.trainer.backends.varlen import Segment
from envhub.trainer.batch import MicroBatch, prompt_groups, to_device

NAME = "envhub_packed_sdpa"
"""The name the function is registered under (``attn_implementation``)."""

SEGMENTS = "envhub_segments"
"""The keyword that carries a packed row's :class:`Segment` list to the attention function."""

VARLEN = "envhub_varlen"
"""The keyword that carries the row's :class:`varlen.VarlenPlan` (the one-call path on GPUs)."""

ROW = "envhub_row"
"""The keyword that carries both as one :class:`Row` (what :meth:`PackedRow.model_inputs`
gives the model)."""

_HALF = (torch.bfloat16, torch.float16)

NO_MASK = torch.ones(1, 1, 1, 1, dtype=torch.bool)
"""The attention mask a packed row is given: a 4-D mask is one transformers takes as built, so
it builds none. Given no mask it would find the row's sequences from the position ids (a device
sync) and build a ``total x total`` mask that :func:`packed_sdpa` ignores for the segments."""


@dataclass(frozen=True)
class PackedRow:
    """The layout of a micro-batch as one row (see the module docstring)."""

    input_ids: torch.Tensor
    """``[1, total]`` the row's tokens."""
    position_ids: torch.Tensor
    """``[1, total]`` each token's position in its own sequence."""
    segments: list[Segment]
    scoring: torch.Tensor
    """``[n, width - 1]`` where in the row the state that scores each target sits (position
    ``t`` of sequence ``i`` scores its token ``t + 1``); 0 on padding."""
    varlen_plan: varlen.VarlenPlan
    """The segments as GPUs' one-call varlen attention takes them."""

    @classmethod
    def of(cls, mb: MicroBatch, share_prompts: bool = True) -> PackedRow:
        """Lay out ``mb`` (right-padded), sharing prompts between its sequences unless told not
        to. A sequence's prompt is what precedes its first trained token; sequences share one
        when theirs are the same tokens."""
        ids, device = mb.input_ids, mb.input_ids.device
        lengths = (mb.attention_mask > 0).sum(1).tolist()
        groups = _prompt_groups(mb, lengths) if share_prompts else None
        tokens: list[torch.Tensor] = []
        positions: list[torch.Tensor] = []
        segments: list[Segment] = []
        scoring = torch.zeros(mb.loss_mask.shape, dtype=torch.long, device=device)
        at = 0
        for prompt, members in groups or [(0, [i]) for i in range(len(lengths))]:
            if prompt:  # the shared prompt once, scoring every member's targets inside it
                tokens.append(ids[members[0], :prompt])
                positions.append(torch.arange(prompt, device=device))
                segments.append(Segment(at, prompt))
                for i in members:
                    scoring[i, :prompt] = torch.arange(at, at + prompt, device=device)
            prompt_start, at = at, at + prompt
            for i in members:
                rest = lengths[i] - prompt
                tokens.append(ids[i, prompt : lengths[i]])
                positions.append(torch.arange(prompt, lengths[i], device=device))
                if prompt:
                    mask = _after_prompt(prompt, rest, device)
                    segments.append(Segment(at, rest, prompt_start, prompt, mask))
                else:
                    segments.append(Segment(at, rest))
                scoring[i, prompt : lengths[i] - 1] = torch.arange(at, at + rest - 1, device=device)
                at += rest
        plan = varlen.VarlenPlan.of(segments)
        return cls(torch.cat(tokens)[None], torch.cat(positions)[None], segments, scoring, plan)

    def to(self, device: torch.device | str) -> PackedRow:
        """A copy with its tensors on ``device`` (a row is laid out on the host, where the
        micro-batch's lengths are known without asking the device)."""
        segments = [
            s if s.mask is None else s._replace(mask=to_device(s.mask, device))
            for s in self.segments
        ]
        return PackedRow(
            to_device(self.input_ids, device),
            to_device(self.position_ids, device),
            segments,
            to_device(self.scoring, device),
            self.varlen_plan.to(device),
        )

    def padded_to(self, total: int) -> PackedRow:
        """This row with pad tokens after its end up to ``total`` (a bucket's length): one more
        segment that attends to itself only and scores nothing."""
        pad = total - self.input_ids.shape[1]
        if pad <= 0:
            return self
        segments = [*self.segments, Segment(self.input_ids.shape[1], pad)]
        return replace(
            self,
            input_ids=torch.nn.functional.pad(self.input_ids, (0, pad)),
            position_ids=torch.cat([self.position_ids, torch.arange(pad)[None]], dim=1),
            segments=segments,
            varlen_plan=varlen.VarlenPlan.of(segments),
        )

    def model_inputs(self) -> dict[str, Any]:
        """Keyword arguments for the model's forward (no attention mask: the segments say who
        attends to whom)."""
        return {
            "input_ids": self.input_ids,
            "position_ids": self.position_ids,
            ROW: Row(self.segments, self.varlen_plan),
        }


def _prompt_groups(mb: MicroBatch, lengths: list[int]) -> list[tuple[int, list[int]]]:
    """``batch.prompt_groups`` of ``mb``'s rows (its loss mask is aligned with the targets: a
    row's token ``t`` is trained where ``loss_mask[t - 1]``)."""
    ids = [mb.input_ids[i, :n].tolist() for i, n in enumerate(lengths)]
    masks = [[0, *mb.loss_mask[i, : n - 1].tolist()] for i, n in enumerate(lengths)]
    return prompt_groups(ids, masks)


def _after_prompt(prompt: int, length: int, device: torch.device) -> torch.Tensor:
    """``[length, prompt + length]``: query ``q`` sees the prompt and its own ``0..q``."""
    keys = torch.arange(prompt + length, device=device)
    return keys[None, :] <= prompt + torch.arange(length, device=device)[:, None]


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

    With :data:`ROW` (or :data:`SEGMENTS`, and :data:`VARLEN`: a packed ``b = 1`` row) each
    :class:`Segment` attends as it says: in one varlen kernel call where :func:`varlen.runs`
    (a GPU, with a plan), else segment by segment; without, transformers' ``sdpa``.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    # Under autocast the rotated queries and keys arrive in float32 and the values in 16 bits;
    # the output goes back in the 16-bit dtype, where the next projection would cast it anyway.
    out_dtype = next((t.dtype for t in (value, query, key) if t.dtype in _HALF), query.dtype)
    compute = torch.float32 if query.device.type == "cpu" else out_dtype
    query, key, value = query.to(compute), key.to(compute), value.to(compute)
    row: Row | None = kwargs.pop(ROW, None)
    segments: list[Segment] | None = kwargs.pop(SEGMENTS, None)
    if row is None and segments is not None:
        row = Row(segments, kwargs.pop(VARLEN, None))
    if row is None:
        with torch.autocast(query.device.type, enabled=False):
            out, _ = sdpa_attention_forward(
                module, query, key, value, attention_mask, dropout, scaling, **kwargs
            )
        return out.to(out_dtype), None
    return _attend_row(query, key, value, row, kwargs, dropout, scaling).to(out_dtype), None


class Row:
    """A packed row's segments and varlen plan, as the model's forward carries them to the
    attention (:data:`ROW`). A plain object, so that compiled layers pass it through to
    :func:`_attend_row` without reading (and guarding on) the lengths."""

    __slots__ = ("segments", "plan")

    def __init__(self, segments: list[Segment], plan: varlen.VarlenPlan | None) -> None:
        self.segments, self.plan = segments, plan


@torch.compiler.disable
def _attend_row(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    row: Row,
    kwargs: dict[str, Any],
    dropout: float,
    scaling: float | None,
) -> torch.Tensor:
    """A packed row's attention, ``[1, T, heads, d]``. Never compiled: compiled decoder layers
    (``compiled_layers``) run it as it is, so that its segments' lengths, which differ in every
    micro-batch, are not baked into the compiled code (one recompilation per layout)."""
    from transformers.integrations.sdpa_attention import repeat_kv

    segments, plan = row.segments, row.plan
    _refuse_what_segments_ignore(segments, kwargs)
    with torch.autocast(query.device.type, enabled=False):
        if plan is not None and varlen.runs(query, dropout):
            return varlen.attend(query, key, value, plan, scaling)
        groups = query.shape[1] // key.shape[1]
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
        parts = [_attend(query, key, value, s, dropout, scaling) for s in segments]
    out = torch.cat(parts, dim=2) if len(parts) > 1 else parts[0]
    return out.transpose(1, 2).contiguous()


def _refuse_what_segments_ignore(segments: list[Segment], kwargs: dict[str, Any]) -> None:
    """Raise where the layer asks for what per-segment causal attention does not do: a sliding
    window shorter than a segment's keys, logit soft-capping, attention sinks."""
    window = kwargs.get("sliding_window")
    span = max(s.prompt_length + s.length for s in segments)
    if window is not None and span > window:
        raise ValueError(
            f"a packed sequence spans {span} tokens, over this layer's sliding window of "
            f"{window}; set backend.packing=padded"
        )
    for unsupported in ("softcap", "s_aux"):
        if kwargs.get(unsupported) is not None:
            raise ValueError(
                f"packed attention does not apply {unsupported!r}; set backend.packing=padded"
            )


def _attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    s: Segment,
    dropout: float,
    scaling: float | None,
) -> torch.Tensor:
    """One segment's attention output, ``[1, heads, s.length, d]``."""
    own = slice(s.start, s.start + s.length)
    keys, values = key[:, :, own], value[:, :, own]
    if s.prompt_length:
        shared = slice(s.prompt_start, s.prompt_start + s.prompt_length)
        keys = torch.cat([key[:, :, shared], keys], dim=2)
        values = torch.cat([value[:, :, shared], values], dim=2)
    return torch.nn.functional.scaled_dot_product_attention(
        query[:, :, own],
        keys,
        values,
        attn_mask=s.mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=not s.prompt_length,
    )
