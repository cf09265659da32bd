"""The vocabulary-parallel entropy metric, computed a few token positions at a time, against the
entropy of the whole softmax (one tensor rank, in this process over gloo)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

pytest.importorskip("megatron.core")

from envhub.trainer.megatron.loss import (  # noqa: E402
    vocab_parallel_entropy,
    vocab_parallel_entropy_report,
)


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
    torch.testing.assert_close(report, expected)
    torch.testing.assert_close(vocab_parallel_entropy(logits), expected)


def test_the_report_keeps_no_graph(one_tensor_rank: None) -> None:
    logits = torch.randn(2, 3, 5, requires_grad=True)
    assert vocab_parallel_entropy_report(logits, rows=2).grad_fn is None
