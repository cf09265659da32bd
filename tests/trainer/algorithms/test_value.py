"""The critic's side of PPO against values worked out by hand: the clipped value loss (and its
invariance to micro-batching), explained variance and advantage whitening."""

from __future__ import annotations

import math

import pytest
import torch

from envhub.trainer.algorithms import clipped_value_loss, explained_variance, masked_whiten

# Two sequences, three places each; the last place of the second is padding (masked).
VALUES = [[1.0, 0.0, 2.0], [0.5, 0.2, 9.0]]
OLD = [[0.5, 0.0, 1.0], [0.5, 0.4, 9.0]]
RETURNS = [[2.0, 1.0, 0.0], [0.5, 0.0, 9.0]]
MASK = [[1, 1, 1], [1, 1, 0]]


def _loss(clip: float | None, rows: slice = slice(None), num_tokens: int = 5):
    values = torch.tensor(VALUES, dtype=torch.float64, requires_grad=True)
    loss, metrics = clipped_value_loss(
        values[rows],
        torch.tensor(OLD, dtype=torch.float64)[rows],
        torch.tensor(RETURNS, dtype=torch.float64)[rows],
        torch.tensor(MASK)[rows],
        clip=clip,
        num_tokens=num_tokens,
    )
    return loss, metrics, values


def test_clipped_value_loss_by_hand() -> None:
    # clip 0.2: V clipped to [V_old - 0.2, V_old + 0.2]
    #   place  V    V_old R    (V-R)^2  clipped V  (Vc-R)^2  max
    #   (0,0)  1.0  0.5   2.0  1.0      0.7        1.69      1.69   clipped larger
    #   (0,1)  0.0  0.0   1.0  1.0      0.0        1.0       1.0
    #   (0,2)  2.0  1.0   0.0  4.0      1.2        1.44      4.0
    #   (1,0)  0.5  0.5   0.5  0.0      0.5        0.0       0.0
    #   (1,1)  0.2  0.4   0.0  0.04     0.2        0.04      0.04
    # loss = 0.5 * (1.69 + 1 + 4 + 0 + 0.04) / 5 = 0.673; clip_frac 1/5; error (1+1+4+0+0.04)/5
    loss, metrics, values = _loss(clip=0.2)
    assert loss.item() == pytest.approx(0.673, abs=1e-12)
    assert metrics["clip_frac"].item() == pytest.approx(0.2)
    assert metrics["error"].item() == pytest.approx(6.04 / 5)
    loss.backward()
    # The clipped branch at (0,0) has no gradient to V; elsewhere d/dV 0.5 (V-R)^2 / 5 = (V-R)/5
    expected = [0.0, -0.2, 0.4, 0.0, 0.04, 0.0]
    assert values.grad.flatten().tolist() == pytest.approx(expected, abs=1e-12)


def test_without_clipping_it_is_half_the_mean_squared_error() -> None:
    loss, metrics, _ = _loss(clip=None)
    assert loss.item() == pytest.approx(0.5 * 6.04 / 5, abs=1e-12)
    assert metrics["clip_frac"].item() == 0.0


def test_value_loss_is_the_same_however_the_update_is_split() -> None:
    whole, _, values = _loss(clip=0.2)
    (whole_grad,) = torch.autograd.grad(whole, values)
    first, _, v1 = _loss(clip=0.2, rows=slice(0, 1))
    second, _, v2 = _loss(clip=0.2, rows=slice(1, 2))
    (g1,) = torch.autograd.grad(first, v1)
    (g2,) = torch.autograd.grad(second, v2)
    assert (first + second).item() == pytest.approx(whole.item(), abs=1e-12)
    assert torch.allclose(g1 + g2, whole_grad, atol=1e-12, rtol=0)


def test_explained_variance_by_hand() -> None:
    returns = torch.tensor([1.0, 2.0, 3.0, 4.0])
    # Var(R) = 1.25; residuals R - V = 0, 0, 0, 1 -> Var = 0.1875; EV = 1 - 0.15 = 0.85
    values = torch.tensor([1.0, 2.0, 3.0, 3.0])
    assert explained_variance(values, returns) == pytest.approx(0.85)
    assert explained_variance(returns, returns) == 1.0
    assert explained_variance(torch.full((4,), 2.5), returns) == pytest.approx(0.0)
    masked = explained_variance(values, returns, torch.tensor([1, 1, 1, 0]))
    assert masked == 1.0  # the one miss is masked out
    assert math.isnan(explained_variance(values, torch.ones(4)))  # nothing to explain


def test_masked_whiten_uses_only_the_masked_places() -> None:
    values = torch.tensor([[1.0, 3.0, 100.0], [5.0, -7.0, 3.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]])
    # kept 1, 3, 5, 3: mean 3, biased std sqrt(8/4) = sqrt 2
    out = masked_whiten(values, mask, eps=0.0)
    s = math.sqrt(2)
    assert out.flatten().tolist() == pytest.approx([-2 / s, 0, 0, 2 / s, 0, 0], abs=1e-12)
    assert masked_whiten(values, torch.tensor([[1, 0, 0], [0, 0, 0]])).abs().sum() == 0
