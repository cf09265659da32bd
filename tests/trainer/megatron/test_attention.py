"""``PackedAttention``, the local layers' attention over packed sequences, against causal
attention written out by hand for each sequence alone (grouped key/value heads included)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("megatron.core")

from envhub.errors import ConfigError  # noqa: E402
from envhub.trainer.batch import Packing  # noqa: E402
from envhub.trainer.megatron.attention import (  # noqa: E402
    PackedAttention,
    packed_seq_params,
    segment_lengths,
)

HEADS, GROUPS, DIM = 4, 2, 8
SEGMENTS = [5, 1, 7, 3]


def _config(**changes: object) -> SimpleNamespace:
    fields = {"kv_channels": DIM, "attention_dropout": 0.0, "context_parallel_size": 1,
              "window_size": None, **changes}  # fmt: skip
    return SimpleNamespace(**fields)


def _attention(**changes: object) -> PackedAttention:
    return PackedAttention(_config(**changes), 1, None, "self")


def _by_hand(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of one sequence: ``q`` ``[s, heads, d]``, ``k``/``v`` ``[s, groups, d]``
    (query head h reads group h // (heads / groups)); ``[s, heads * d]``."""
    s = q.shape[0]
    out = torch.empty(s, HEADS, DIM, dtype=torch.float64)
    for h in range(HEADS):
        g = h // (HEADS // GROUPS)
        scores = (q[:, h] @ k[:, g].T) / DIM**0.5
        scores = scores.masked_fill(torch.ones(s, s).triu(1).bool(), float("-inf"))
        out[:, h] = scores.softmax(-1) @ v[:, g]
    return out.flatten(1)


def _qkv(total: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(total, HEADS, DIM, generator=g, dtype=torch.float64),
        torch.randn(total, GROUPS, DIM, generator=g, dtype=torch.float64),
        torch.randn(total, GROUPS, DIM, generator=g, dtype=torch.float64),
    )


def test_each_packed_sequence_attends_only_to_itself_causally() -> None:
    q, k, v = _qkv(sum(SEGMENTS))
    params = packed_seq_params(Packing(tuple(SEGMENTS)), torch.device("cpu"))
    out = _attention()(q, k, v, None, packed_seq_params=params)
    assert out.shape == (sum(SEGMENTS), HEADS * DIM)
    start = 0
    for n in SEGMENTS:
        window = slice(start, start + n)
        torch.testing.assert_close(out[window], _by_hand(q[window], k[window], v[window]))
        start += n


def test_segment_lengths_in_place_of_the_mask_give_the_same_attention() -> None:
    """The worker's path without Transformer Engine: ``[s, 1, heads, d]`` layer inputs, the
    lengths as a CPU tensor where megatron-core passes the mask."""
    q, k, v = _qkv(sum(SEGMENTS))
    lengths = segment_lengths(SEGMENTS)
    assert lengths.device.type == "cpu" and lengths.tolist() == SEGMENTS
    out = _attention()(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), lengths)
    assert out.shape == (sum(SEGMENTS), 1, HEADS * DIM)
    params = packed_seq_params(Packing(tuple(SEGMENTS)), torch.device("cpu"))
    torch.testing.assert_close(out[:, 0], _attention()(q, k, v, None, packed_seq_params=params))
    start = 0
    for n in SEGMENTS:
        window = slice(start, start + n)
        torch.testing.assert_close(out[window, 0], _by_hand(q[window], k[window], v[window]))
        start += n


def test_the_params_carry_megatrons_boundaries_and_the_lengths() -> None:
    params = packed_seq_params(Packing(tuple(SEGMENTS)), torch.device("cpu"))
    assert params.qkv_format == "thd"
    assert params.cu_seqlens_q.tolist() == params.cu_seqlens_kv.tolist() == [0, 5, 6, 13, 16]
    assert params.cu_seqlens_q.dtype == torch.int32
    assert (params.max_seqlen_q, params.max_seqlen_kv) == (7, 7)


def test_unpacked_input_is_one_causal_sequence_per_batch_row() -> None:
    """``[s, b, heads, d]`` without packed parameters, as megatron-core passes it."""
    q, k, v = _qkv(12)
    rows = [t.reshape(6, 2, *t.shape[1:]) for t in (q, k, v)]  # s=6, b=2: rows interleave
    out = _attention()(*rows, None)
    assert out.shape == (6, 2, HEADS * DIM)
    for b in range(2):
        torch.testing.assert_close(out[:, b], _by_hand(*(t[:, b] for t in rows)))


def test_a_softmax_scale_from_the_config_is_used() -> None:
    q, k, v = _qkv(4)
    params = packed_seq_params(Packing((4,)), torch.device("cpu"))
    scaled = PackedAttention(_config(), 1, None, "self", softmax_scale=2 / DIM**0.5)
    torch.testing.assert_close(
        scaled(q, k, v, None, packed_seq_params=params), _by_hand(2 * q, k, v)
    )


@pytest.mark.parametrize(
    ("change", "words"),
    [({"context_parallel_size": 2}, "context parallelism"), ({"window_size": (8, 0)}, "window")],
)
def test_what_it_cannot_do_is_refused(change: dict, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        _attention(**change)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_one_varlen_call_matches_attention_per_sequence() -> None:
    from envhub.trainer.backends import varlen

    q, k, v = (t.to("cuda", torch.bfloat16).requires_grad_() for t in _qkv(sum(SEGMENTS)))
    assert varlen.runs(q, 0.0)
    lengths = segment_lengths(SEGMENTS)
    kernel = _attention()(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), lengths)[:, 0]
    start, parts = 0, []
    for n in SEGMENTS:  # each sequence alone: the single-segment path, plain causal SDPA
        window = slice(start, start + n)
        parts.append(_attention()(q[window, None], k[window, None], v[window, None], None))
        start += n
    alone = torch.cat(parts)[:, 0]
    torch.testing.assert_close(kernel, alone, rtol=2e-2, atol=2e-2)
    grads = torch.autograd.grad(kernel.float().square().sum(), (q, k, v))
    reference = torch.autograd.grad(alone.float().square().sum(), (q, k, v))
    for got, want in zip(grads, reference, strict=True):
        torch.testing.assert_close(got, want, rtol=5e-2, atol=5e-2)
