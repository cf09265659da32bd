"""Advantage estimators against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from envhub.errors import ConfigError
from envhub.trainer.algorithms import compute_advantages
from envhub.trainer.algorithms.registry import outcome_estimators

# Three groups with arbitrary, interleaved ids and different sizes:
#   id 7:   rewards 1, 0, 0, 1   mean 0.5, deviations +-0.5, unbiased var 4*0.25/3 = 1/3
#   id -2:  rewards 3, 1, 2      mean 2,   deviations 1, -1, 0, unbiased var 2/2 = 1
#   id 100: reward 5             a group of one
REWARDS = [1.0, 3.0, 0.0, 1.0, 5.0, 0.0, 2.0, 1.0]
IDS = [7, -2, 7, -2, 100, 7, -2, 7]
S3 = math.sqrt(3)  # 0.5 / sqrt(1/3) = sqrt(3) / 2


def _run(name: str, device: str = "cpu", **kwargs: object) -> list[float]:
    rewards = torch.tensor(REWARDS, device=device)
    ids = torch.tensor(IDS, device=device)
    out = compute_advantages(name, rewards, ids, **kwargs)
    assert out.shape == (8,) and out.device.type == device
    return out.cpu().tolist()


def test_grpo_divides_by_the_unbiased_group_std(device: str) -> None:
    expected = [S3 / 2, 1.0, -S3 / 2, -1.0, 0.0, -S3 / 2, 0.0, S3 / 2]
    assert _run("grpo", device, eps=0.0) == pytest.approx(expected, abs=1e-6)


def test_grpo_eps_keeps_a_constant_group_finite() -> None:
    out = compute_advantages("grpo", torch.tensor([1.0, 1.0]), torch.tensor([0, 0]))
    assert out.tolist() == [0.0, 0.0]


def test_grpo_without_std_scaling_is_dr_grpo() -> None:
    expected = [0.5, 1.0, -0.5, -1.0, 0.0, -0.5, 0.0, 0.5]
    assert _run("grpo", scale_by_std=False) == pytest.approx(expected)
    assert _run("dr_grpo") == pytest.approx(expected)


def test_rloo_subtracts_the_mean_of_the_other_samples() -> None:
    # id 7, r=1: others 0, 0, 1 -> 1 - 1/3 = 2/3; r=0: others 1, 0, 1 -> 0 - 2/3.
    # id -2, r=3: others 1, 2 -> 3 - 1.5 = 1.5; r=1: others 3, 2 -> -1.5; r=2: others 3, 1 -> 0.
    expected = [2 / 3, 1.5, -2 / 3, -1.5, 0.0, -2 / 3, 0.0, 2 / 3]
    assert _run("rloo") == pytest.approx(expected, abs=1e-6)


def test_reinforce_pp_whitens_over_the_batch_ignoring_groups() -> None:
    # rewards 1, 2, 3, 6: mean 3, deviations -2, -1, 0, 3, unbiased var (4+1+0+9)/3 = 14/3.
    std = math.sqrt(14 / 3)
    out = compute_advantages(
        "reinforce++", torch.tensor([1.0, 2.0, 3.0, 6.0]), torch.tensor([0, 0, 1, 1]), eps=0.0
    )
    assert out.tolist() == pytest.approx([-2 / std, -1 / std, 0.0, 3 / std], abs=1e-6)


def test_reinforce_pp_baseline_centres_per_group_then_whitens_over_the_batch() -> None:
    # Group-centred: 0.5, 1, -0.5, -1, 0, -0.5, 0, 0.5 (mean 0);
    # unbiased var over the 8 samples: (4*0.25 + 1 + 1) / 7 = 3/7.
    std = math.sqrt(3 / 7)
    expected = [v / std for v in [0.5, 1.0, -0.5, -1.0, 0.0, -0.5, 0.0, 0.5]]
    assert _run("reinforce++_baseline", eps=0.0) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("name", sorted(outcome_estimators()))
def test_every_estimator_gives_a_lone_sample_zero(name: str) -> None:
    out = compute_advantages(name, torch.tensor([4.0]), torch.tensor([3]))
    assert out.tolist() == [0.0]


def test_unknown_estimator_lists_the_valid_names() -> None:
    with pytest.raises(
        ConfigError, match=r"did you mean 'rloo'.*valid: dr_grpo, gpg, grpo, opo, reinforce\+\+"
    ):
        compute_advantages("rlo", torch.zeros(2), torch.zeros(2, dtype=torch.long))


def test_opo_baseline_is_the_length_weighted_group_mean() -> None:
    # id 0: rewards 1, 0, 1 with lengths 2, 4, 6: b = (2 + 0 + 6) / 12 = 2/3.
    # id 5: rewards 0, 2 with lengths 1, 3: b = (0 + 6) / 4 = 1.5.
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0], dtype=torch.float64)
    ids = torch.tensor([0, 5, 0, 0, 5])
    lengths = torch.tensor([2, 1, 4, 6, 3])
    out = compute_advantages("opo", rewards, ids, lengths=lengths)
    assert out.tolist() == pytest.approx([1 / 3, -1.5, -2 / 3, 1 / 3, 0.5], abs=1e-12)


def test_opo_with_equal_lengths_is_dr_grpo() -> None:
    lengths = torch.full((8,), 7)
    assert _run("opo", lengths=lengths) == pytest.approx(_run("dr_grpo"), abs=1e-6)
    assert _run("opo") == pytest.approx(_run("dr_grpo"), abs=1e-6)


def test_gpg_scales_by_samples_over_samples_in_groups_that_differ() -> None:
    # id 0: 1, 0, 1, 0 (differ: 4 valid); id 1: 1, 1 (tied); id 2: 0.5 (alone). alpha = 7 / 4.
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.5, 1.0, 1.0, 0.0])
    ids = torch.tensor([0, 1, 0, 2, 0, 1, 0])
    out = compute_advantages("gpg", rewards, ids)
    assert out.tolist() == pytest.approx([0.875, 0.0, -0.875, 0.0, 0.875, 0.0, -0.875])
    # F_norm = group std (unbiased: sqrt(1/3)): 0.5 / 0.57735 * 7/4 = 1.515544
    scaled = compute_advantages("gpg", rewards, ids, scale_by_std=True, eps=0.0)
    value = 0.5 / math.sqrt(1 / 3) * 7 / 4
    assert scaled.tolist() == pytest.approx([value, 0, -value, 0, value, 0, -value], abs=1e-6)


def test_gpg_without_any_group_that_differs_is_all_zero() -> None:
    out = compute_advantages("gpg", torch.tensor([1.0, 1.0, 0.0]), torch.tensor([0, 0, 1]))
    assert out.tolist() == [0.0, 0.0, 0.0]


def test_remax_subtracts_each_tasks_greedy_reward_and_gives_zero_without_one(device: str) -> None:
    # Baselines: the greedy episode of each sample's task; task of id -2 had none (nan).
    baselines = {7: 0.25, -2: math.nan, 100: 5.0}
    b = torch.tensor([baselines[i] for i in IDS], device=device)
    out = compute_advantages(
        "remax", torch.tensor(REWARDS, device=device), torch.tensor(IDS), baselines=b
    )
    expected = [0.75, 0.0, -0.25, 0.0, 0.0, -0.25, 0.0, 0.75]
    assert out.cpu().tolist() == pytest.approx(expected, abs=1e-7)
    with pytest.raises(ValueError, match=r"baselines \(2,\) != rewards \(8,\)"):
        compute_advantages("remax", torch.tensor(REWARDS), torch.tensor(IDS), baselines=b[:2])
