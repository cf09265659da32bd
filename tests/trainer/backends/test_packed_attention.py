"""Packed micro-batches on the torch backend: each sequence of a packed row attends to itself
only, and a shared prompt runs once with every sequence after it attending to it, so the
logprobs, entropies and gradients equal the padded batch's; 16-bit attention on the CPU runs in
float32; the setting picks the layout or refuses with a reason."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from envhub.errors import ConfigError
from envhub.trainer.backends import packed_attention
from envhub.trainer.backends.hf_model import takes_packed_attention
from envhub.trainer.backends.packed_attention import SEGMENTS, PackedRow, Segment
from envhub.trainer.backends.torch_backend import TorchBackend, target_logits
from envhub.trainer.batch import Batch, Sample, micro_batches
from envhub.trainer.config import validate_config

transformers = pytest.importorskip("transformers")


class _Attention(torch.nn.Module):
    """What an attention function reads from its module."""

    is_causal = True
    num_key_value_groups = 2


def _qkv(lengths: list[int], dtype: torch.dtype = torch.float32):
    generator = torch.Generator().manual_seed(0)
    total = sum(lengths)
    q = torch.randn(1, 4, total, 8, generator=generator).to(dtype).requires_grad_()
    k = torch.randn(1, 2, total, 8, generator=generator).to(dtype).requires_grad_()
    v = torch.randn(1, 2, total, 8, generator=generator).to(dtype).requires_grad_()
    return q, k, v


def _reference(q, k, v, queries: slice, keys: list[slice], scale: float) -> torch.Tensor:
    """Attention by hand: ``queries`` over ``keys`` (their concatenation), causal with the
    queries at the end, grouped heads repeated."""
    kk = torch.cat([k[:, :, s] for s in keys], 2).repeat_interleave(2, 1)
    vv = torch.cat([v[:, :, s] for s in keys], 2).repeat_interleave(2, 1)
    n, m = queries.stop - queries.start, kk.shape[2]
    scores = (q[:, :, queries] @ kk.transpose(-1, -2)) * scale
    future = torch.arange(m)[None, :] > (m - n + torch.arange(n))[:, None]
    return (scores.masked_fill(future, float("-inf")).softmax(-1) @ vv).transpose(1, 2)


def _check(out: torch.Tensor, expected: torch.Tensor, inputs: tuple) -> None:
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)
    grads = torch.autograd.grad(out.square().sum(), inputs)
    reference = torch.autograd.grad(expected.square().sum(), inputs)
    for got, want in zip(grads, reference, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_each_segment_attends_causally_to_itself_alone() -> None:
    q, k, v = _qkv([5, 1, 7])
    segments = [Segment(0, 5), Segment(5, 1), Segment(6, 7)]
    out, weights = packed_attention.packed_sdpa(
        _Attention(), q, k, v, None, scaling=0.3, **{SEGMENTS: segments}
    )
    assert weights is None and out.shape == (1, 13, 4, 8)
    spans = [slice(0, 5), slice(5, 6), slice(6, 13)]
    expected = torch.cat([_reference(q, k, v, s, [s], 0.3) for s in spans], 1)
    _check(out, expected, (q, k, v))


def test_a_rest_attends_to_its_shared_prompt_as_the_whole_sequence_would() -> None:
    q, k, v = _qkv([3, 4, 2])  # a 3-token prompt, then two sequences' rests
    prompt, first, second = slice(0, 3), slice(3, 7), slice(7, 9)
    segments = [
        Segment(0, 3),
        Segment(3, 4, 0, 3, packed_attention._after_prompt(3, 4, torch.device("cpu"))),
        Segment(7, 2, 0, 3, packed_attention._after_prompt(3, 2, torch.device("cpu"))),
    ]
    out, _ = packed_attention.packed_sdpa(
        _Attention(), q, k, v, None, scaling=0.3, **{SEGMENTS: segments}
    )
    expected = torch.cat([
        _reference(q, k, v, prompt, [prompt], 0.3),
        _reference(q, k, v, first, [prompt, first], 0.3),
        _reference(q, k, v, second, [prompt, second], 0.3),
    ], 1)  # fmt: skip
    _check(out, expected, (q, k, v))


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({"sliding_window": 6}, "spans 7 tokens, over this layer's sliding window of 6"),
        ({"softcap": 50.0}, "'softcap'"),
        ({"s_aux": torch.zeros(4)}, "'s_aux'"),
    ],
)
def test_what_segments_cannot_honour_is_refused(extra: dict, reason: str) -> None:
    q, k, v = _qkv([5, 7])
    segments = [Segment(0, 5), Segment(5, 7)]
    with pytest.raises(ValueError, match=reason + ".*backend.packing=padded"):
        packed_attention.packed_sdpa(_Attention(), q, k, v, None, **{SEGMENTS: segments}, **extra)
    window = {"sliding_window": 7}  # every segment fits: nothing to refuse
    out, _ = packed_attention.packed_sdpa(_Attention(), q, k, v, None, **{SEGMENTS: segments},
                                          **window)  # fmt: skip
    assert out.shape == (1, 12, 4, 8)


def test_without_boundaries_it_is_transformers_sdpa() -> None:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q, k, v = _qkv([6])
    mask = torch.ones(1, 1, 6, 6, dtype=torch.bool).tril()
    mask[..., 0] = False  # a padded first place: attention must read the mask
    mask[..., 0, 0] = True
    out, _ = packed_attention.packed_sdpa(_Attention(), q, k, v, mask, scaling=0.5)
    expected, _ = sdpa_attention_forward(_Attention(), q, k, v, mask, scaling=0.5)
    assert torch.equal(out, expected)


def test_16_bit_attention_on_the_cpu_runs_in_float32() -> None:
    q, k, v = _qkv([4, 3], torch.bfloat16)
    segments = [Segment(0, 4), Segment(4, 3)]
    with torch.autocast("cpu", dtype=torch.bfloat16):  # queries rotated in float32, as in a model
        out, _ = packed_attention.packed_sdpa(
            _Attention(), q.float(), k.float(), v, None, **{SEGMENTS: segments}
        )
    exact, _ = packed_attention.packed_sdpa(
        _Attention(), q.float(), k.float(), v.float(), None, **{SEGMENTS: segments}
    )
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, exact.to(torch.bfloat16))


# -- the torch backend ------------------------------------------------------------------------


def _backend(model_dir: Path, model: dict | None = None, **backend: object) -> TorchBackend:
    config = {
        "model": {"name": str(model_dir), **(model or {})},
        "envs": [{"name": "arithmetic"}],
        "backend": {"device": "cpu", **backend},
        "rollout": {"temperature": 0.7},
    }
    return TorchBackend(validate_config(config))


def _batch() -> Batch:
    """Samples 0, 1, 3 and 4 start with the same 3-token prompt (4 goes on with a tool result
    between two trained turns); 2 stands alone; 5 starts the same but trains nothing."""
    generator = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, 400, (3,), generator=generator).tolist()
    masks = [
        [0, 0, 0, 1, 1, 1, 0],
        [0, 0, 0, 1, 1],
        [0, 0, 0, 0, 1, 1, 1],
        [0, 0, 0, 1],
        [0, 0, 0, 1, 1, 0, 0, 0, 1, 1],
        [0, 0, 0, 0, 0],
    ]
    samples = []
    for i, m in enumerate(masks):
        ids = torch.randint(0, 400, (len(m),), generator=generator).tolist()
        if i != 2:
            ids[:3] = prompt
        samples.append(Sample(ids, m, [0.0] * len(m), 1.0 - 0.25 * i, i))
    return Batch(samples)


def _scores(backend: TorchBackend, mb) -> tuple[torch.Tensor, torch.Tensor, dict]:
    backend.model.zero_grad()
    logprobs, entropy = backend._token_logprobs(backend.model, mb, with_entropy=True)
    (logprobs * mb.loss_mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in backend.model.named_parameters() if p.grad is not None}
    return logprobs.detach(), entropy, grads


@pytest.mark.parametrize("lora", [False, True])
def test_a_packed_micro_batch_scores_and_trains_as_the_padded_one(
    tiny_model_dir: Path, lora: bool
) -> None:
    adapters = {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    model = {"lora": adapters} if lora else {}
    backend = _backend(tiny_model_dir, model)
    assert backend.packed  # the CPU default
    (mb,) = micro_batches(_batch(), 1024, pad_id=0)
    packed = _scores(backend, mb)
    backend.packed = False
    padded = _scores(backend, mb)
    torch.testing.assert_close(packed[0], padded[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(packed[1], padded[1], rtol=0, atol=1e-5)
    assert packed[2].keys() == padded[2].keys() and packed[2]
    for name, grad in packed[2].items():
        torch.testing.assert_close(grad, padded[2][name], rtol=1e-4, atol=1e-5, msg=name)


def test_a_model_with_a_post_processed_head_packs_too(tiny_model_dir: Path) -> None:
    backend = _backend(tiny_model_dir)
    backend.model.config.model_type = "gemma2"  # scored at every place, not at the kept ones
    (mb,) = micro_batches(_batch(), 1024, pad_id=0)
    packed = backend._token_logprobs(backend.model, mb)[0]
    backend.packed = False
    padded = backend._token_logprobs(backend.model, mb)[0]
    real = mb.attention_mask[:, 1:] > 0  # the padding's places score nothing either way
    torch.testing.assert_close(packed[real], padded[real], rtol=0, atol=1e-5)


def test_a_packed_row_runs_a_shared_prompt_once() -> None:
    a = Sample([5, 6, 7, 8, 9], [0, 0, 0, 1, 1], [0.0] * 5, 1.0, 0)
    b = Sample([5, 6, 7, 10], [0, 0, 0, 1], [0.0] * 4, 1.0, 1)
    c = Sample([1, 2, 3], [0, 1, 1], [0.0] * 3, 1.0, 2)
    (mb,) = micro_batches(Batch([a, b, c]), 1024, pad_id=0)
    assert mb.samples == [0, 1, 2]
    layout = PackedRow.of(mb)
    assert layout.input_ids.tolist() == [[5, 6, 7, 8, 9, 10, 1, 2, 3]]
    assert layout.position_ids.tolist() == [[0, 1, 2, 3, 4, 3, 0, 1, 2]]
    assert [s[:4] for s in layout.segments] == [(0, 3, 0, 0), (3, 2, 0, 3), (5, 1, 0, 3),
                                                (6, 3, 0, 0)]  # fmt: skip
    assert layout.segments[1].mask.tolist() == [[True] * 4 + [False], [True] * 5]
    # position t scores token t + 1: a's first trained token (8) from the prompt's last state
    assert layout.scoring.tolist() == [[0, 1, 2, 3], [0, 1, 2, 0], [6, 7, 0, 0]]
    alone = PackedRow.of(mb, share_prompts=False)
    assert alone.input_ids.tolist() == [[5, 6, 7, 8, 9, 5, 6, 7, 10, 1, 2, 3]]
    assert [s[:4] for s in alone.segments] == [(0, 5, 0, 0), (5, 4, 0, 0), (9, 3, 0, 0)]


def test_the_backend_bins_as_it_runs(tiny_model_dir: Path) -> None:
    batch = _batch()  # lengths 7, 5, 7, 4, 10, 5; the shared prompt's group costs 3 + 17
    packed = _backend(tiny_model_dir, micro_batch_tokens=20)
    padded = _backend(tiny_model_dir, micro_batch_tokens=20, packing="padded")
    assert packed.packed and not padded.packed
    assert [mb.samples for mb in packed.micro_batches(batch)] == [[4, 0, 1, 3], [2, 5]]
    assert [mb.samples for mb in padded.micro_batches(batch)] == [[4, 0], [2, 1], [5, 3]]


def test_packing_is_refused_for_an_attention_that_cannot_separate_sequences(
    tiny_model_dir: Path,
) -> None:
    with pytest.raises(ConfigError, match="attn_implementation.*backend.packing=padded"):
        _backend(tiny_model_dir, {"attn_implementation": "eager"}, packing="packed")
    assert not _backend(tiny_model_dir, {"attn_implementation": "eager"}).packed


def test_a_gpu_keeps_transformers_attention_unless_packing_is_asked(tiny_model_dir: Path) -> None:
    backend = _backend(tiny_model_dir)
    model, cuda = backend.model, torch.device("cuda")  # a device object; nothing runs on it
    assert not takes_packed_attention(model, backend.config, cuda)
    packed = validate_config(backend.config.model_dump() | {"backend": {"packing": "packed"}})
    assert takes_packed_attention(model, packed, cuda)
    eager = validate_config(backend.config.model_dump(mode="json") | {
        "model": {"name": str(tiny_model_dir), "attn_implementation": "eager"}
    })  # fmt: skip
    assert not takes_packed_attention(model, eager, torch.device("cpu"))
    model.config.model_type = "gemma2"  # soft-caps its attention logits: stays transformers'
    assert not takes_packed_attention(model, backend.config, torch.device("cpu"))


def test_a_packed_forward_refuses_an_attention_that_would_ignore_the_segments(
    tiny_model_dir: Path,
) -> None:
    backend = _backend(tiny_model_dir, {"attn_implementation": "sdpa"}, packing="padded")
    (mb,) = micro_batches(_batch(), 1024, pad_id=0)
    with pytest.raises(ConfigError, match="packed_sdpa"):
        target_logits(backend.model, mb, packed=True)
