"""The chunked logprobs and entropy metric, a few token positions at a time, against the whole
softmax written with torch (one tensor rank, in this process over gloo; ``test_worker.py``
checks them under tensor parallelism against the torch backend)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

pytest.importorskip("megatron.core")

from envhub.trainer.megatron.loss import (  # noqa: E402
    chunked_logprobs,
    vocab_parallel_entropy,
    vocab_parallel_entropy_report,
)

TEMPERATURE = 0.7


@pytest.fixture(scope="module")
def one_tensor_rank() -> Iterator[None]:
    """torch.distributed and Megatron's parallel state for a single CPU rank."""
    from megatron.core import parallel_state as mpu

    store = torch.distributed.HashStore()  # in-process: one rank needs no rendezvous
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    mpu.initialize_model_parallel(1, 1)
    yield
    mpu.destroy_model_parallel()
    torch.distributed.destroy_process_group()


@pytest.mark.parametrize("rows", [1, 3, 7, 100])
def test_the_report_in_chunks_equals_the_whole_entropy(one_tensor_rank: None, rows: int) -> None:
    logits = torch.randn(1, 7, 11, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    expected = -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)
    report = vocab_parallel_entropy_report(logits, rows=rows)
    assert report.shape == (1, 7) and not report.requires_grad
    torch.testing.assert_close(report.double(), expected, atol=1e-5, rtol=0)  # in float32
    torch.testing.assert_close(vocab_parallel_entropy(logits), expected)


def test_the_report_keeps_no_graph(one_tensor_rank: None) -> None:
    logits = torch.randn(2, 3, 5, requires_grad=True)
    assert vocab_parallel_entropy_report(logits, rows=2).grad_fn is None


def _logits(dtype: torch.dtype = torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return (3 * torch.randn(1, 7, 11, generator=g, dtype=torch.float64)).to(dtype)


def test_the_report_divides_by_the_temperature_in_float32(one_tensor_rank: None) -> None:
    logits = _logits(torch.bfloat16)
    scaled = logits.double() / TEMPERATURE
    expected = -(scaled.softmax(-1) * scaled.log_softmax(-1)).sum(-1)
    report = vocab_parallel_entropy_report(logits, TEMPERATURE, rows=3)
    assert report.dtype == torch.float32
    torch.testing.assert_close(report.double(), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("rows", [1, 3, 100])
def test_chunked_logprobs_and_their_gradient_match_log_softmax(
    one_tensor_rank: None, rows: int
) -> None:
    targets = torch.tensor([[0, 10, 3, 3, 7, 1, 5]])
    upstream = torch.linspace(-1, 2, 7).reshape(1, 7).double()
    ours_in = _logits().requires_grad_()
    theirs_in = _logits().requires_grad_()
    ours = chunked_logprobs(ours_in, targets, TEMPERATURE, rows=rows)
    theirs = (theirs_in / TEMPERATURE).log_softmax(-1).gather(-1, targets[..., None])[..., 0]
    assert ours.shape == (1, 7) and ours.dtype == torch.float32
    torch.testing.assert_close(ours.double(), theirs, atol=1e-5, rtol=0)  # float32 softmax
    (ours.double() * upstream).sum().backward()
    (theirs * upstream).sum().backward()
    assert ours_in.grad.dtype == torch.float64  # the logits' own dtype
    torch.testing.assert_close(ours_in.grad, theirs_in.grad, atol=1e-6, rtol=0)


def test_bf16_logits_keep_their_dtype_and_lose_only_their_rounding(one_tensor_rank: None) -> None:
    """The model's bf16 output goes in as it is; the softmax runs in float32."""
    targets = torch.tensor([[2, 4, 6, 8, 10, 0, 1]])
    logits = _logits(torch.bfloat16).requires_grad_()
    ours = chunked_logprobs(logits, targets, TEMPERATURE, rows=2)
    exact = (logits.double() / TEMPERATURE).log_softmax(-1).gather(-1, targets[..., None])[..., 0]
    torch.testing.assert_close(ours.double(), exact.detach(), atol=1e-5, rtol=0)
    ours.sum().backward()
    assert logits.grad.dtype == torch.bfloat16
    p = (logits.detach().double() / TEMPERATURE).softmax(-1)
    expected = (torch.nn.functional.one_hot(targets, 11) - p) / TEMPERATURE
    torch.testing.assert_close(logits.grad.double(), expected, atol=1e-2, rtol=0)
