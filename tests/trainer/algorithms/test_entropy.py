"""Token entropy and selected-token log-probs against hand values and the plain torch formula."""

from __future__ import annotations

import math

import pytest
import torch

from envhub.trainer.algorithms import selective_log_softmax, token_entropy


def test_entropy_hand_values(device: str, assert_close) -> None:
    inf = float("inf")
    logits = torch.tensor(
        [
            [
                [0.0, 0.0, 0.0, 0.0],  # uniform over 4: ln 4 = 1.386294
                [0.0, -inf, -inf, -inf],  # one-hot (masked vocabulary): 0, not NaN
                [0.0, math.log(3), -inf, -inf],  # p = 1/4, 3/4: -(1/4 ln 1/4 + 3/4 ln 3/4)
                [50.0, 0.0, 0.0, 0.0],  # one-hot-ish: ~0
            ]
        ],
        device=device,
        requires_grad=True,
    )
    two_way = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))  # 0.562335
    entropy = token_entropy(logits)
    assert_close(entropy, [[math.log(4), 0.0, two_way, 0.0]], atol=1e-5)
    entropy.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_chunked_entropy_matches_in_value_and_gradient() -> None:
    logits = torch.randn(2, 7, 11, generator=torch.Generator().manual_seed(0), requires_grad=True)
    whole = token_entropy(logits)
    (whole_grad,) = torch.autograd.grad(whole.sum(), logits)
    chunked = token_entropy(logits, chunk_size=3)
    (chunked_grad,) = torch.autograd.grad(chunked.sum(), logits)
    torch.testing.assert_close(chunked, whole)
    torch.testing.assert_close(chunked_grad, whole_grad)
    with torch.no_grad():
        torch.testing.assert_close(token_entropy(logits, chunk_size=2), whole)


def test_entropy_of_half_precision_logits_is_float32(assert_close) -> None:
    out = token_entropy(torch.zeros(1, 2, 8, dtype=torch.bfloat16))
    assert out.dtype == torch.float32
    assert_close(out, [[math.log(8)] * 2])


def test_selective_log_softmax_hand_value(assert_close) -> None:
    # p = softmax(0, ln 3) = (1/4, 3/4): token 1 -> ln 0.75 = -0.287682, token 0 -> ln 0.25.
    logits = torch.tensor([[[0.0, math.log(3)], [0.0, math.log(3)]]])
    out = selective_log_softmax(logits, torch.tensor([[1, 0]]))
    assert_close(out, [[math.log(0.75), math.log(0.25)]])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_selective_log_softmax_matches_log_softmax_gather(dtype: torch.dtype, device: str) -> None:
    generator = torch.Generator().manual_seed(1)
    logits = (4 * torch.randn(3, 5, 1000, generator=generator)).to(device=device, dtype=dtype)
    ids = torch.randint(0, 1000, (3, 5), generator=generator).to(device)
    logits.requires_grad_()
    got = selective_log_softmax(logits, ids)
    # The reference in float32 or better, from the same (possibly rounded) logits.
    ref_logits = logits.float() if dtype == torch.bfloat16 else logits
    want = torch.log_softmax(ref_logits, -1).gather(-1, ids[..., None]).squeeze(-1)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    (got_grad,) = torch.autograd.grad(got.sum(), logits)
    (want_grad,) = torch.autograd.grad(want.sum(), logits)
    torch.testing.assert_close(got_grad, want_grad)
