"""Tinker's built-in losses as the service computes them, against hand-computed values."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from envhub.errors import ConfigError  # noqa: E402
from envhub.trainer.service.losses import LOSSES, get_loss  # noqa: E402

LOGPROBS = torch.tensor([-1.0, -0.5, -2.0])
SAMPLER = torch.tensor([-1.0, -1.0, -1.0])
ADVANTAGES = torch.tensor([1.0, 1.0, -1.0])


def test_cross_entropy_is_the_weighted_negative_logprob() -> None:
    loss = LOSSES["cross_entropy"](LOGPROBS, {"weights": torch.tensor([0.0, 1.0, 2.0])}, {})
    assert loss.tolist() == [0.0, 0.5, 4.0]
    assert LOSSES["cross_entropy"](LOGPROBS, {}, {}).tolist() == [1.0, 0.5, 2.0]


def test_importance_sampling_weighs_advantages_by_the_ratio() -> None:
    inputs = {"logprobs": SAMPLER, "advantages": ADVANTAGES}
    loss = LOSSES["importance_sampling"](LOGPROBS, inputs, {})
    assert loss.tolist() == pytest.approx([-1.0, -math.exp(0.5), math.exp(-1.0)])


def test_ppo_clips_the_ratio_at_the_thresholds() -> None:
    inputs = {"logprobs": SAMPLER, "advantages": ADVANTAGES}
    config = {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}
    loss = LOSSES["ppo"](LOGPROBS, inputs, config)
    # ratios 1, e^0.5 (clipped to 1.1 for A > 0), e^-1 (A < 0: min picks the clipped 0.9 * -1)
    assert loss.tolist() == pytest.approx([-1.0, -1.1, 0.9])


def test_ppo_gradient_vanishes_where_clipped() -> None:
    logprobs = LOGPROBS.clone().requires_grad_()
    inputs = {"logprobs": SAMPLER, "advantages": ADVANTAGES}
    LOSSES["ppo"](logprobs, inputs, {}).sum().backward()
    assert logprobs.grad.tolist() == pytest.approx([-1.0, 0.0, 0.0])


def test_a_missing_input_or_loss_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="needs loss_fn_inputs advantages"):
        LOSSES["ppo"](LOGPROBS, {"logprobs": SAMPLER}, {})
    with pytest.raises(ConfigError, match="use one of cross_entropy, importance_sampling, ppo"):
        get_loss("dpo")
