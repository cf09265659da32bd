"""PPO-clip and GSPO token losses, metrics and gradients against hand-worked values."""

from __future__ import annotations

import math

import pytest
import torch

from envhub.errors import ConfigError
from envhub.trainer.algorithms import POLICY_LOSSES, compute_policy_loss, gspo, ppo_clip

LN = math.log


def _ppo_batch(device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two rows with ratios 0.5, 1.0, 1.5 and a 4th, masked token holding garbage log-probs.

    Row 0 has A = +1, row 1 has A = -1.
    """
    old = torch.full((2, 4), LN(0.4), device=device)
    logp = old + torch.tensor([LN(0.5), 0.0, LN(1.5), 0.0], device=device)
    logp[0, 3], logp[1, 3] = float("nan"), float("inf")
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]], device=device)
    return logp.requires_grad_(), old, torch.tensor([1.0, -1.0], device=device), mask


def test_ppo_clip_values_metrics_and_gradient(device: str, assert_close) -> None:
    logp, old, adv, mask = _ppo_batch(device)
    loss, metrics = ppo_clip(logp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    # A=+1: -min(r, clip(r, 0.8, 1.28)) -> r=0.5: -min(0.5, 0.8) = -0.5; r=1: -1;
    #        r=1.5: -min(1.5, 1.28) = -1.28 (clipped high).
    # A=-1: -min(-r, -clip(r)) = max(r, clip(r)) -> r=0.5: max(0.5, 0.8) = 0.8 (clipped low);
    #        r=1: 1; r=1.5: max(1.5, 1.28) = 1.5.
    expected = [[-0.5, -1.0, -1.28, 0.0], [0.8, 1.0, 1.5, 0.0]]
    assert_close(loss, expected)
    assert {k: v.item() for k, v in metrics.items()} == pytest.approx(
        {"clip_frac": 2 / 6, "clip_frac_low": 1 / 6, "clip_frac_high": 1 / 6, "ratio_mean": 1.0}
    )
    loss.sum().backward()
    # d(-r*A)/d logp = -A*r where the unclipped branch wins, 0 where the clipped one does;
    # masked tokens get exactly 0 although their log-probs are NaN / inf.
    grad = [[-0.5, -1.0, 0.0, 0.0], [0.0, 1.0, 1.5, 0.0]]
    assert_close(logp.grad, grad)


def test_ppo_dual_clip_caps_negative_advantage_losses(assert_close) -> None:
    logp, old, adv, mask = _ppo_batch("cpu")
    loss, metrics = ppo_clip(logp, old, adv, mask, dual_clip=1.4)
    # Only A=-1, r=1.5 has a loss (1.5) above -c*A = 1.4; it becomes the constant 1.4.
    assert_close(loss, [[-0.5, -1.0, -1.28, 0.0], [0.8, 1.0, 1.4, 0.0]])
    assert metrics["dual_clip_frac"].item() == pytest.approx(1 / 6)
    loss.sum().backward()
    assert_close(logp.grad, [[-0.5, -1.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]])


def test_ppo_clip_accepts_per_token_advantages() -> None:
    logp, old, adv, mask = _ppo_batch("cpu")
    by_row, _ = ppo_clip(logp, old, adv, mask)
    by_token, _ = ppo_clip(logp, old, adv[:, None].expand(2, 4), mask.float())
    assert torch.equal(by_row, by_token)


def test_gspo_uses_the_sequence_ratio_with_per_token_gradients(assert_close) -> None:
    # log-ratios 0.3, -0.1, 0.1 (+ a masked garbage token): mean 0.1, s = e^0.1 = 1.105171.
    old = torch.tensor([[-1.0, -2.0, -0.5, 0.0]])
    logp = (old + torch.tensor([[0.3, -0.1, 0.1, float("nan")]])).requires_grad_()
    mask = torch.tensor([[True, True, True, False]])
    adv = torch.tensor([[1.0, 2.0, 3.0, float("nan")]])
    loss, metrics = gspo(logp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    s = math.exp(0.1)
    # s is inside [0.8, 1.28]: token loss = -s * A_t.
    assert_close(loss, [[-s, -2 * s, -3 * s, 0.0]])
    assert metrics["ratio_mean"].item() == pytest.approx(s)
    loss.sum().backward()
    # s_t = sg(s) * exp(logp_t - sg(logp_t)) -> d s_t / d logp_t = s, d s_t / d logp_u = 0:
    # d(sum_t -s_t A_t)/d logp_t = -s A_t. (Differentiating exp(mean(logp - old)) instead would
    # give every token -s * (1+2+3)/3 = -2s.)
    assert_close(logp.grad, [[-s, -2 * s, -3 * s, 0.0]])


def test_gspo_clips_the_sequence_ratio(assert_close) -> None:
    old = torch.zeros(1, 3)
    logp = torch.tensor([[0.3, -0.1, 0.1]], requires_grad=True)  # s = e^0.1 > 1 + 4e-4
    loss, metrics = gspo(logp, old, torch.tensor([1.0]), torch.ones(1, 3))
    assert_close(loss, [[-(1 + 4e-4)] * 3], atol=1e-7)
    assert metrics["clip_frac_high"].item() == 1.0
    loss.sum().backward()
    assert logp.grad.tolist() == [[0.0, 0.0, 0.0]]


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_on_policy_loss_is_minus_the_advantage_with_the_policy_gradient(name: str) -> None:
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], requires_grad=True)
    loss, metrics = compute_policy_loss(
        name, logp, logp.detach(), torch.tensor([2.0, -1.0]), torch.ones(2, 2)
    )
    assert loss.tolist() == [[-2.0, -2.0], [1.0, 1.0]]
    assert metrics["clip_frac"].item() == 0.0
    loss.sum().backward()
    assert logp.grad.tolist() == [[-2.0, -2.0], [1.0, 1.0]]


def test_bad_names_and_ranges_are_config_errors() -> None:
    x = torch.zeros(1, 2)
    with pytest.raises(ConfigError, match="did you mean 'gspo'"):
        compute_policy_loss("gpso", x, x, torch.zeros(1), x)
    with pytest.raises(ConfigError, match="dual_clip must be > 1"):
        ppo_clip(x, x, torch.zeros(1), x, dual_clip=1.0)
