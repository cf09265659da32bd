"""The fused logprob/entropy pass against the whole softmax written with torch in float64: the
eager chunk functions (the reference), then the compiled ones (inductor compiles these tiny
shapes on the CPU in seconds, once per test module), and on a GPU the Triton kernels."""

from __future__ import annotations

import math

import pytest
import torch

from envhub.trainer.backends.fused_logprobs import chunk_forward, fused_logprobs

TEMPERATURE = 0.7


def _inputs(
    positions: int = 7, vocab: int = 11, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(positions, vocab, generator=g, dtype=torch.float64)).to(dtype)
    targets = torch.randint(0, vocab, (positions,), generator=g)
    return logits.to(device), targets.to(device)


def _reference(
    logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logprobs, entropy and the gradient of ``sum(weights * logprobs)``, in float64."""
    z = logits.detach().double().requires_grad_()
    logp = (z / TEMPERATURE).log_softmax(-1)
    picked = logp.gather(-1, targets[:, None])[:, 0]
    entropy = -(logp.exp() * logp).sum(-1)
    (picked * weights.double()).sum().backward()
    return picked.detach(), entropy.detach(), z.grad


def _check(logits: torch.Tensor, targets: torch.Tensor, *, rows: int, compiled: bool, tol: float):
    weights = torch.linspace(-1.0, 2.0, targets.numel(), device=logits.device)
    ours_in = logits.detach().clone().requires_grad_()
    logprobs, entropy = fused_logprobs(ours_in, targets, TEMPERATURE, rows=rows, compiled=compiled)
    assert logprobs.dtype == entropy.dtype == torch.float32
    assert not entropy.requires_grad
    (logprobs * weights).sum().backward()
    assert ours_in.grad.dtype == logits.dtype
    expected = _reference(logits, targets, weights)
    for got, want in zip((logprobs, entropy, ours_in.grad), expected, strict=True):
        torch.testing.assert_close(got.double(), want, atol=tol, rtol=0)


@pytest.mark.parametrize("rows", [1, 3, 7, 100])
def test_the_eager_chunks_equal_the_whole_softmax(rows: int) -> None:
    _check(*_inputs(), rows=rows, compiled=False, tol=1e-5)  # float32 against float64


def test_a_hand_computed_case() -> None:
    # logits [0, ln 3] at temperature 1: p = [1/4, 3/4], H = -(1/4 ln 1/4 + 3/4 ln 3/4)
    logits = torch.tensor([[0.0, math.log(3.0)]])
    logprob, _, entropy = chunk_forward(logits, torch.tensor([1]), 1.0)
    assert logprob.item() == pytest.approx(math.log(0.75), abs=1e-7)
    expected = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert entropy.item() == pytest.approx(expected, abs=1e-7)


def test_a_masked_vocabulary_gives_finite_entropy() -> None:
    logits = torch.tensor([[0.0, -math.inf, math.log(3.0)]])
    logprob, log_partition, entropy = chunk_forward(logits, torch.tensor([2]), 1.0)
    assert logprob.item() == pytest.approx(math.log(0.75), abs=1e-7)
    assert entropy.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))
    assert log_partition.item() == pytest.approx(math.log(4.0), abs=1e-7)


def test_bf16_logits_are_read_in_float32_and_keep_their_dtype_for_the_gradient() -> None:
    logits, targets = _inputs(dtype=torch.bfloat16)
    # The reference reads the same bf16 values; the gradient is rounded to bf16 (2^-8).
    _check(logits, targets, rows=3, compiled=False, tol=1e-2)


def test_the_shape_of_the_targets_is_kept() -> None:
    logits, targets = _inputs(positions=6)
    logprobs, entropy = fused_logprobs(
        logits.reshape(2, 3, -1), targets.reshape(2, 3), 1.0, compiled=False
    )
    assert logprobs.shape == entropy.shape == (2, 3)


def test_the_compiled_chunks_equal_the_whole_softmax_on_the_cpu() -> None:
    # Chunks of 3, 3 and 1 rows: one dynamic kernel each way. Inductor may sum in another
    # order than eager: equal to float32 rounding.
    _check(*_inputs(), rows=3, compiled=True, tol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_triton_kernels_equal_the_eager_chunks() -> None:
    logits, targets = _inputs(positions=2500, vocab=32000, dtype=torch.bfloat16, device="cuda")
    weights = torch.randn(2500, device="cuda")
    results = []
    for compiled in (False, True):
        x = logits.clone().requires_grad_()
        logprobs, entropy = fused_logprobs(x, targets, TEMPERATURE, compiled=compiled)
        (logprobs * weights).sum().backward()
        results.append((logprobs, entropy, x.grad.float()))
    for eager, fused in zip(*results, strict=True):
        torch.testing.assert_close(fused, eager, atol=1e-4, rtol=0)
