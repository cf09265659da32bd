"""Packed micro-batches on the torch backend: each sequence of a packed row attends to itself
only, so the logprobs, entropies and gradients equal the padded batch's; 16-bit attention on the
CPU runs in float32; the setting picks the layout or refuses with a reason."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from envhub.errors import ConfigError
from envhub.trainer.backends import packed_attention
from envhub.trainer.backends.torch_backend import TorchBackend
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


def _boundaries(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def test_each_segment_attends_causally_to_itself_alone() -> None:
    lengths = [5, 1, 7]
    q, k, v = _qkv(lengths)
    out, weights = packed_attention.packed_sdpa(
        _Attention(), q, k, v, None, scaling=0.3, cu_seq_lens_q=_boundaries(lengths)
    )
    assert weights is None and out.shape == (1, sum(lengths), 4, 8)
    expected, start = [], 0
    for n in lengths:  # each sequence alone, grouped heads repeated by hand
        s = slice(start, start + n)
        kk, vv = k[:, :, s].repeat_interleave(2, 1), v[:, :, s].repeat_interleave(2, 1)
        scores = (q[:, :, s] @ kk.transpose(-1, -2)) * 0.3
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        expected.append((scores.softmax(-1) @ vv).transpose(1, 2))
        start += n
    torch.testing.assert_close(out, torch.cat(expected, 1), rtol=0, atol=1e-6)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    reference = torch.autograd.grad(torch.cat(expected, 1).square().sum(), (q, k, v))
    for got, want in zip(grads, reference, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


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
    lengths = [4, 3]
    q, k, v = _qkv(lengths, torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # queries rotated in float32, as in a model
        out, _ = packed_attention.packed_sdpa(
            _Attention(), q.float(), k.float(), v, None, cu_seq_lens_q=_boundaries(lengths)
        )
    exact, _ = packed_attention.packed_sdpa(
        _Attention(), q.float(), k.float(), v.float(), None, cu_seq_lens_q=_boundaries(lengths)
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
    generator = torch.Generator().manual_seed(5)
    masks = [[0, 0, 0, 1, 1, 1, 0, 0, 1, 1], [0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0, 1], [0, 1]]
    return Batch([
        Sample(torch.randint(0, 400, (len(m),), generator=generator).tolist(), m,
               [0.0] * len(m), 1.0, i)
        for i, m in enumerate(masks)
    ])  # fmt: skip


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
    model = {"lora": {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}} if lora else {}
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


def test_packed_bins_count_real_tokens_and_padded_bins_padded_ones(tiny_model_dir: Path) -> None:
    batch = _batch()  # lengths 10, 5, 7, 2
    packed = _backend(tiny_model_dir, micro_batch_tokens=17)
    padded = _backend(tiny_model_dir, micro_batch_tokens=17, packing="padded")
    assert packed.packed and not padded.packed
    assert [mb.samples for mb in packed.micro_batches(batch)] == [[0, 2], [1, 3]]
    assert [mb.samples for mb in padded.micro_batches(batch)] == [[0], [2, 1], [3]]


def test_packing_is_refused_for_an_attention_that_cannot_separate_sequences(
    tiny_model_dir: Path,
) -> None:
    with pytest.raises(ConfigError, match="attn_implementation.*backend.packing=padded"):
        _backend(tiny_model_dir, {"attn_implementation": "eager"}, packing="packed")
    assert not _backend(tiny_model_dir, {"attn_implementation": "eager"}).packed
