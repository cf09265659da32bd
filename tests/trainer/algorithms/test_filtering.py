"""Dynamic sampling and DAPO's overlong shaping against hand values."""

from __future__ import annotations

import pytest
import torch

from envhub.errors import ConfigError
from envhub.trainer.algorithms import overlong_filter_mask, overlong_penalty, zero_variance_groups


def test_zero_variance_groups_are_dropped(device: str) -> None:
    # id 3: all 1 (drop); id 9: 0 and 1 (keep); id 4: a group of one (drop);
    # id -1: 2 and 2 + 1e-9, equal within 1e-8 (drop); id 5: 0.3 and 0.3 + 1e-7 (keep).
    rewards = torch.tensor([1, 0, 1, 1, 0.5, 2, 1, 2 + 1e-9, 0.3, 0.3 + 1e-7], dtype=torch.float64)
    ids = torch.tensor([3, 9, 3, 9, 4, -1, 3, -1, 5, 5])
    keep = zero_variance_groups(rewards.to(device), ids.to(device))
    assert keep.tolist() == [False, True, False, True, False, False, False, False, True, True]


def test_overlong_penalty_is_dapo_soft_punishment(device: str) -> None:
    # max 10, buffer 4: free up to 6, then (6 - L) / 4, then -1 past 10.
    lengths = torch.tensor([5, 6, 7, 8, 10, 11], device=device)
    penalty = overlong_penalty(lengths, max_length=10, buffer=4)
    assert penalty.tolist() == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]


@pytest.mark.parametrize("buffer", [0, 11])
def test_overlong_penalty_rejects_a_bad_buffer(buffer: int) -> None:
    with pytest.raises(ConfigError, match="0 < buffer <= max_length"):
        overlong_penalty(torch.tensor([1]), max_length=10, buffer=buffer)


def test_overlong_filter_keeps_untruncated_samples() -> None:
    assert overlong_filter_mask(torch.tensor([True, False, True])).tolist() == [False, True, False]
    assert overlong_filter_mask(torch.tensor([1, 0])).tolist() == [False, True]
