"""KL in the reward: the controllers' update sequences and the per-token penalty, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from envhub.trainer.algorithms import kl_token_rewards, make_kl_controller, measured_kl


def test_adaptive_controller_update_sequence() -> None:
    c = make_kl_controller("adaptive", 0.1, target_kl=0.5, horizon=100)
    c.update(1.0, n_steps=10)  # error clip(2 - 1) = 0.2:   0.1 * (1 + 0.2 * 10/100) = 0.102
    assert c.coef == pytest.approx(0.102, abs=1e-15)
    c.update(0.45, n_steps=20)  # error 0.9 - 1 = -0.1:     0.102 * (1 - 0.1 * 0.2) = 0.09996
    assert c.coef == pytest.approx(0.09996, abs=1e-15)
    c.update(0.0, n_steps=50)  # error clip(-1) = -0.2:     0.09996 * (1 - 0.2 * 0.5) = 0.089964
    assert c.coef == pytest.approx(0.089964, abs=1e-15)
    c.update(0.5, n_steps=1000)  # on target: unchanged
    assert c.coef == pytest.approx(0.089964, abs=1e-15)


def test_fixed_controller_never_moves_and_both_resume_from_their_state() -> None:
    fixed = make_kl_controller("fixed", 0.05)
    fixed.update(10.0, n_steps=1000)
    assert fixed.coef == 0.05
    a = make_kl_controller("adaptive", 0.1, target_kl=0.5, horizon=100)
    a.update(1.0, n_steps=10)
    b = make_kl_controller("adaptive", 0.1, target_kl=0.5, horizon=100)
    b.load_state_dict(a.state_dict())
    a.update(0.3, n_steps=7)
    b.update(0.3, n_steps=7)
    assert a.coef == b.coef and a.state_dict() == {"coef": a.coef}


def test_controller_errors() -> None:
    with pytest.raises(ValueError, match="needs target_kl and horizon"):
        make_kl_controller("adaptive", 0.1)
    with pytest.raises(ValueError, match="unknown KL controller"):
        make_kl_controller("pid", 0.1)


def test_kl_token_rewards_by_hand() -> None:
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, 0.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.5, -2.0, -9.0], [-2.0, -0.75, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    # k1 = logp - ref: [0.5, 0, (masked)] and [1, -0.25, (masked)]
    rewards, per_sequence = kl_token_rewards(logp, ref, mask, coef=0.1)
    assert rewards.flatten().tolist() == pytest.approx([-0.05, 0, 0, -0.1, 0.025, 0], abs=1e-12)
    assert per_sequence.tolist() == pytest.approx([0.25, 0.375], abs=1e-12)
    assert measured_kl(per_sequence) == pytest.approx(0.3125, abs=1e-12)
    # k3 with x = ref - logp = -0.5: e^-0.5 + 0.5 - 1
    k3, _ = kl_token_rewards(logp[:1, :1], ref[:1, :1], mask[:1, :1], coef=1.0, estimator="k3")
    assert k3.item() == pytest.approx(-(math.exp(-0.5) - 0.5), abs=1e-12)
    assert measured_kl(torch.zeros(0)) == 0.0
