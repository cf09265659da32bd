"""GPUs attend a packed row in one varlen kernel call: the plan the host builds for it (the
segments' query and key boundaries, the keys of a shared prompt gathered in front of a
sequence's own) gives, under the kernel's causal rule, exactly the per-segment attention; on a
GPU the kernel's output and gradients match the per-segment path."""

from __future__ import annotations

import pytest
import torch

from envhub.trainer.backends import packed_attention, varlen
from envhub.trainer.backends.packed_attention import SEGMENTS, VARLEN, PackedRow
from envhub.trainer.batch import Batch, Sample, micro_batches

pytest.importorskip("transformers")


class _Attention(torch.nn.Module):
    is_causal = True
    num_key_value_groups = 2


def _row() -> PackedRow:
    """a and b share the prompt [5, 6, 7]; c is alone."""
    a = Sample([5, 6, 7, 8, 9], [0, 0, 0, 1, 1], [0.0] * 5, 1.0, 0)
    b = Sample([5, 6, 7, 10], [0, 0, 0, 1], [0.0] * 4, 1.0, 1)
    c = Sample([1, 2, 3], [0, 1, 1], [0.0] * 3, 1.0, 2)
    (mb,) = micro_batches(Batch([a, b, c]), 1024, pad_id=0)
    return PackedRow.of(mb)


def test_the_plan_of_a_row_with_a_shared_prompt() -> None:
    plan = _row().varlen_plan  # segments: prompt [0,3), a's rest [3,5), b's [5,6), c [6,9)
    assert plan.cu_queries.tolist() == [0, 3, 5, 6, 9]
    assert plan.cu_keys.tolist() == [0, 3, 8, 12, 15]
    assert plan.cu_queries.dtype == plan.cu_keys.dtype == torch.int32
    assert (plan.max_queries, plan.max_keys) == (3, 5)
    assert plan.key_index.tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 2, 5, 6, 7, 8]


def test_a_row_without_shared_prompts_keeps_its_keys_in_place() -> None:
    a = Sample([1, 2, 3], [0, 1, 1], [0.0] * 3, 1.0, 0)
    b = Sample([4, 5], [0, 1], [0.0] * 2, 1.0, 1)
    (mb,) = micro_batches(Batch([a, b]), 1024, pad_id=0)
    plan = PackedRow.of(mb).varlen_plan
    assert plan.key_index is None
    assert plan.cu_queries.tolist() == plan.cu_keys.tolist() == [0, 3, 5]


def _by_the_kernels_rule(q, k, v, plan: varlen.VarlenPlan, scale: float) -> torch.Tensor:
    """What flash-attention's varlen kernel computes, written out: each segment's queries over
    its gathered keys, causal aligned to the bottom right (query ``i`` of ``n`` sees keys up to
    ``m - n + i`` of ``m``), grouped heads repeated. ``[1, T, heads, d]``."""
    q, k, v = (t[0].transpose(0, 1) for t in (q, k, v))
    if plan.key_index is not None:
        k, v = k[plan.key_index], v[plan.key_index]
    k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    bounds_q, bounds_k = plan.cu_queries.tolist(), plan.cu_keys.tolist()
    parts = []
    for s in range(len(bounds_q) - 1):
        qs = q[bounds_q[s] : bounds_q[s + 1]].transpose(0, 1)  # [heads, n, d]
        ks = k[bounds_k[s] : bounds_k[s + 1]].transpose(0, 1)
        vs = v[bounds_k[s] : bounds_k[s + 1]].transpose(0, 1)
        n, m = qs.shape[1], ks.shape[1]
        future = torch.arange(m)[None, :] > (m - n + torch.arange(n))[:, None]
        weights = ((qs @ ks.transpose(-1, -2)) * scale).masked_fill(future, float("-inf"))
        parts.append((weights.softmax(-1) @ vs).transpose(0, 1))
    return torch.cat(parts)[None]


def _qkv(total: int, device: str = "cpu", dtype: torch.dtype = torch.float32):
    generator = torch.Generator().manual_seed(0)
    shapes = [(1, 4, total, 8), (1, 2, total, 8), (1, 2, total, 8)]
    return [torch.randn(s, generator=generator).to(device, dtype).requires_grad_() for s in shapes]


def test_the_plan_under_the_kernels_rule_is_the_per_segment_attention() -> None:
    row = _row()
    q, k, v = _qkv(row.input_ids.shape[1])
    expected, _ = packed_attention.packed_sdpa(
        _Attention(), q, k, v, None, scaling=0.5, **{SEGMENTS: row.segments}
    )
    got = _by_the_kernels_rule(q, k, v, row.varlen_plan, 0.5)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def test_the_cpu_never_takes_the_kernel() -> None:
    q, _, _ = _qkv(4, dtype=torch.bfloat16)
    assert not varlen.runs(q, 0.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_kernel_matches_the_per_segment_path() -> None:
    row = _row().to("cuda")
    q, k, v = _qkv(row.input_ids.shape[1], "cuda", torch.bfloat16)
    assert varlen.runs(q, 0.0)
    kernel, _ = packed_attention.packed_sdpa(
        _Attention(), q, k, v, None, scaling=0.5,
        **{SEGMENTS: row.segments, VARLEN: row.varlen_plan},
    )  # fmt: skip
    segmented, _ = packed_attention.packed_sdpa(
        _Attention(), q, k, v, None, scaling=0.5, **{SEGMENTS: row.segments}
    )
    torch.testing.assert_close(kernel, segmented, rtol=2e-2, atol=2e-2)
    grads = torch.autograd.grad(kernel.float().square().sum(), (q, k, v))
    reference = torch.autograd.grad(segmented.float().square().sum(), (q, k, v))
    for got, want in zip(grads, reference, strict=True):
        torch.testing.assert_close(got, want, rtol=5e-2, atol=5e-2)
