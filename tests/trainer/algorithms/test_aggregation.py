"""Loss aggregation: hand values on a 2x3 batch and invariance to micro-batch splits."""

from __future__ import annotations

import pytest
import torch

from envhub.errors import ConfigError
from envhub.trainer.algorithms import AGGREGATIONS, aggregate

NAN = float("nan")
# Row 0 keeps tokens 1, 2; row 1 keeps token 4. Masked entries hold garbage.
LOSS = [[1.0, 2.0, NAN], [4.0, float("inf"), -7.0]]
MASK = [[1, 1, 0], [1, 0, 0]]


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", (1 + 2 + 4) / 3),  # 3 loss tokens
        ("seq-mean-token-mean", ((1 + 2) / 2 + 4 / 1) / 2),  # 2 sequences
        ("seq-mean-token-sum-norm", (1 + 2 + 4) / (2 * 4)),  # norm_length 4
    ],
)
def test_hand_values(mode: str, expected: float, device: str) -> None:
    loss = torch.tensor(LOSS, device=device, requires_grad=True)
    mask = torch.tensor(MASK, device=device)
    out = aggregate(loss, mask, mode, num_tokens=3, num_sequences=2, norm_length=4)
    assert out.item() == pytest.approx(expected)
    out.backward()
    assert torch.isfinite(loss.grad).all() and loss.grad[~mask.bool()].eq(0).all()


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(7, 6, generator=generator, dtype=torch.float64, requires_grad=True)
    inputs = torch.randn(7, 6, generator=generator, dtype=torch.float64)
    lengths = torch.tensor([6, 1, 3, 5, 2, 4, 6])  # very different lengths make a split matter
    mask = torch.arange(6)[None, :] < lengths[:, None]
    return weight, inputs, mask


@pytest.mark.parametrize("mode", sorted(AGGREGATIONS))
def test_summing_any_split_gives_the_whole_batch_loss_and_gradient(mode: str) -> None:
    weight, inputs, mask = _batch()
    totals = {"num_tokens": int(mask.sum()), "num_sequences": 7, "norm_length": 6}

    whole = aggregate((weight * inputs) ** 2, mask, mode, **totals)
    (whole_grad,) = torch.autograd.grad(whole, weight)

    parts = [slice(0, 2), slice(2, 3), slice(3, 7)]
    summed = sum(aggregate((weight[s] * inputs[s]) ** 2, mask[s], mode, **totals) for s in parts)
    (split_grad,) = torch.autograd.grad(summed, weight)
    assert summed.item() == pytest.approx(whole.item(), abs=1e-6)
    assert torch.allclose(split_grad, whole_grad, atol=1e-6, rtol=0)

    # The test can fail: normalising each micro-batch by its own totals is not invariant.
    local = sum(
        aggregate((weight[s] * inputs[s]) ** 2, mask[s], mode, num_tokens=int(mask[s].sum()),
                  num_sequences=mask[s].shape[0], norm_length=6)
        for s in parts
    )  # fmt: skip
    assert abs(local.item() - whole.item()) > 1e-3


def test_counts_may_be_tensors() -> None:
    loss = torch.tensor(LOSS)
    out = aggregate(
        loss, torch.tensor(MASK), "token-mean", num_tokens=torch.tensor(3), num_sequences=2
    )
    assert out.item() == pytest.approx(7 / 3)


def test_errors_name_the_fix() -> None:
    loss, mask = torch.zeros(1, 2), torch.ones(1, 2)
    with pytest.raises(ConfigError, match="did you mean 'token-mean'"):
        aggregate(loss, mask, "token_mean", num_tokens=2, num_sequences=1)
    with pytest.raises(ConfigError, match="needs norm_length"):
        aggregate(loss, mask, "seq-mean-token-sum-norm", num_tokens=2, num_sequences=1)
