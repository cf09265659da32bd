"""KL estimators k1/k2/k3 against hand values."""

from __future__ import annotations

import math

import pytest
import torch

from envhub.errors import ConfigError
from envhub.trainer.algorithms import KL_ESTIMATORS, kl_penalty

L2 = math.log(2)


def _logprobs(device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    # Token 0: pi = 0.5, ref = 0.25 (ratio ref/pi = 1/2); token 1: pi = 0.25, ref = 0.5 (2).
    logp = torch.tensor([[math.log(0.5), math.log(0.25)]], device=device, requires_grad=True)
    ref = torch.tensor([[math.log(0.25), math.log(0.5)]], device=device)
    return logp, ref


@pytest.mark.parametrize(
    ("name", "expected", "grad"),
    [
        # k1 = logp - ref; d/dlogp = 1.
        ("k1", [L2, -L2], [1.0, 1.0]),
        # k2 = (logp - ref)^2 / 2 = (ln 2)^2 / 2 = 0.240227; d/dlogp = logp - ref.
        ("k2", [L2**2 / 2, L2**2 / 2], [L2, -L2]),
        # k3 = e^x - x - 1 with x = ref - logp: x = -ln 2 -> 0.5 + ln 2 - 1 = 0.193147;
        #      x = ln 2 -> 2 - ln 2 - 1 = 0.306853.  d/dlogp = 1 - e^x = 0.5 and -1.
        ("k3", [0.5 + L2 - 1, 2 - L2 - 1], [0.5, -1.0]),
    ],
)
def test_estimators(
    name: str, expected: list[float], grad: list[float], device: str, assert_close
) -> None:
    logp, ref = _logprobs(device)
    kl = kl_penalty(name, logp, ref)
    assert_close(kl, [expected])
    kl.sum().backward()
    assert_close(logp.grad, [grad])


@pytest.mark.parametrize("name", sorted(KL_ESTIMATORS))
def test_equal_policies_have_zero_kl(name: str) -> None:
    logp = torch.tensor([[-0.3, -2.0, -5.0]])
    assert kl_penalty(name, logp, logp.clone()).tolist() == [[0.0, 0.0, 0.0]]


@pytest.mark.parametrize("name", sorted(KL_ESTIMATORS))
def test_masked_tokens_are_zero_and_get_no_gradient(name: str) -> None:
    logp = torch.tensor([[math.log(0.5), float("nan")]], requires_grad=True)
    ref = torch.tensor([[math.log(0.25), float("-inf")]])
    kl = kl_penalty(name, logp, ref, torch.tensor([[1, 0]]))
    assert kl[0, 1].item() == 0.0 and torch.isfinite(kl).all()
    kl.sum().backward()
    assert logp.grad[0, 1].item() == 0.0


def test_unknown_estimator() -> None:
    with pytest.raises(ConfigError, match="valid: k1, k2, k3"):
        kl_penalty("k4", torch.zeros(1, 1), torch.zeros(1, 1))
