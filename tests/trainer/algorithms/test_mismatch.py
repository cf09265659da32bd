"""Sampler-vs-trainer mismatch weights, masks and metrics against hand values."""

from __future__ import annotations

import math

import pytest
import torch

from envhub.errors import ConfigError
from envhub.trainer.algorithms import mismatch_weights

LN = math.log


def _batch(device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """trainer/sampler ratios: row 0 = 1.0, 2.5, 1.5; row 1 = 0.4, 1.0, (masked, NaN sampler)."""
    sampler = torch.full((2, 3), LN(0.2), device=device)
    sampler[1, 2] = float("nan")
    ratios = torch.tensor([[1.0, 2.5, 1.5], [0.4, 1.0, 1.0]], device=device)
    trainer = (sampler + ratios.log()).requires_grad_()
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], device=device)
    return trainer, sampler, mask


def test_tis_truncates_the_ratio_and_reports_the_metrics(device: str, assert_close) -> None:
    trainer, sampler, mask = _batch(device)
    weights, keep, metrics = mismatch_weights(trainer, sampler, mask, mode="tis", cap=2.0)
    assert_close(weights, [[1.0, 2.0, 1.5], [0.4, 1.0, 1.0]], atol=1e-5)
    assert not weights.requires_grad
    assert keep.tolist() == [[True, True, True], [True, True, False]]
    # Over the 5 tokens: |log r| = 0, ln 2.5, ln 1.5, ln 2.5, 0;  r = 1, 2.5, 1.5, 0.4, 1;
    # k3 = r - ln r - 1 = 0, 0.583709, 0.094535, 0.316291, 0.
    expected = {
        "mismatch_kl": (2.5 - LN(2.5) - 1 + 1.5 - LN(1.5) - 1 + 0.4 + LN(2.5) - 1) / 5,
        "mismatch_abs_logprob_diff_mean": (2 * LN(2.5) + LN(1.5)) / 5,
        "mismatch_abs_logprob_diff_max": LN(2.5),
        "mismatch_ratio_mean": (1 + 2.5 + 1.5 + 0.4 + 1) / 5,
        "mismatch_masked_frac": 0.0,
        "mismatch_truncated_frac": 1 / 5,  # only 2.5 > cap
    }
    assert {k: v.item() for k, v in metrics.items()} == pytest.approx(expected, abs=1e-6)


def test_mask_token_drops_tokens_outside_the_bounds() -> None:
    trainer, sampler, mask = _batch()
    weights, keep, metrics = mismatch_weights(
        trainer, sampler, mask, mode="mask-token", low=0.5, high=2.0
    )
    assert weights.tolist() == [[1.0] * 3] * 2
    assert keep.tolist() == [[True, False, True], [False, True, False]]  # 2.5 and 0.4 dropped
    assert metrics["mismatch_masked_frac"].item() == pytest.approx(2 / 5)
    assert metrics["mismatch_truncated_frac"].item() == 0.0


@pytest.mark.parametrize(
    ("low", "high", "keep"),
    [
        # Geometric means: row 0 (1 * 2.5 * 1.5)^(1/3) = 1.5536, row 1 (0.4 * 1)^(1/2) = 0.6325.
        (0.5, 2.0, [[True, True, True], [True, True, False]]),
        (0.7, 2.0, [[True, True, True], [False, False, False]]),
        (0.5, 1.5, [[False, False, False], [True, True, False]]),
    ],
)
def test_mask_sequence_drops_whole_sequences(low: float, high: float, keep: list) -> None:
    trainer, sampler, mask = _batch()
    _, got, metrics = mismatch_weights(
        trainer, sampler, mask, mode="mask-sequence", low=low, high=high
    )
    assert got.tolist() == keep
    assert metrics["mismatch_masked_frac"].item() == pytest.approx(1 - sum(map(sum, keep)) / 5)


def test_none_changes_nothing_but_still_measures() -> None:
    trainer, sampler, mask = _batch()
    weights, keep, metrics = mismatch_weights(trainer, sampler, mask, mode="none")
    assert weights.tolist() == [[1.0] * 3] * 2 and torch.equal(keep, mask.bool())
    assert metrics["mismatch_ratio_mean"].item() == pytest.approx(6.4 / 5)


def test_bad_configuration() -> None:
    trainer, sampler, mask = _batch()
    with pytest.raises(ConfigError, match="did you mean 'mask-token'"):
        mismatch_weights(trainer, sampler, mask, mode="mask_token")
    with pytest.raises(ConfigError, match="low <= 1 <= high"):
        mismatch_weights(trainer, sampler, mask, mode="mask-token", low=1.5, high=2.0)
