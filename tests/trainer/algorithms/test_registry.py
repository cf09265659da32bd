"""The algorithm registries are the config's one source of names, and adding an estimator is
a function and a registry entry: this file adds one and trains a step with it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from envhub.errors import ConfigError
from envhub.rollout.io import iter_trajectories
from envhub.testing import LetterEnv
from envhub.trainer import scoring
from envhub.trainer.algorithms.registry import (
    ADVANTAGES,
    AGGREGATIONS,
    ESTIMATOR_INPUTS,
    KL_ESTIMATORS,
    MISMATCH_MODES,
    POLICY_LOSSES,
    Algorithm,
    Estimator,
    Registry,
    turn_estimators,
)
from envhub.trainer.config import AlgorithmConfig, validate_config
from envhub.trainer.loop import train

REGISTRIES = [ADVANTAGES, POLICY_LOSSES, AGGREGATIONS, KL_ESTIMATORS, MISMATCH_MODES]

# -- the toy estimator: its function and its entry are all it takes -------------------------

CALLS: list[dict[str, torch.Tensor]] = []


def sign_of_gap(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """+1 above the group's mean reward, -1 below, 0 on it (and for a group of one)."""
    _, index = torch.unique(group_ids, return_inverse=True)
    sums = torch.zeros(int(index.max()) + 1, dtype=rewards.dtype).index_add_(0, index, rewards)
    counts = torch.zeros_like(sums).index_add_(0, index, torch.ones_like(rewards))
    advantages = torch.sign(rewards - (sums / counts)[index])
    CALLS.append({"rewards": rewards.clone(), "groups": group_ids.clone(), "out": advantages})
    return advantages


TOY = Estimator("sign_of_gap", sign_of_gap, summary="sign of r - group mean", needs_group=True)


@pytest.fixture
def toy() -> Iterator[Estimator]:
    CALLS.clear()
    ADVANTAGES.register(TOY)
    yield TOY
    ADVANTAGES.unregister(TOY.name)


def _config(model_dir: Path, out: Path, **algorithm: Any) -> dict[str, Any]:
    return {
        "steps": 1,
        "seed": 5,
        "model": {"name": str(model_dir)},
        "envs": [{"name": LetterEnv.name}],
        "rollout": {"tasks_per_step": 2, "samples_per_task": 4, "max_tokens": 8},
        "algorithm": {"mismatch": "none", "dynamic_sampling": False, **algorithm},
        "optimizer": {"lr": 1e-3},
        "backend": {"device": "cpu", "micro_batch_tokens": 64},
        "logging": {"output_dir": str(out), "run_name": "run", "plot": False},
        "checkpoint": {"every": 1, "export_hf": True},
    }


@pytest.mark.usefixtures("letter_env")
def test_a_registered_toy_estimator_trains_a_step(
    toy: Estimator, tiny_model_dir: Path, tmp_path: Path
) -> None:
    result = train(validate_config(_config(tiny_model_dir, tmp_path, advantage=toy.name)))

    assert len(CALLS) == 1  # the trainer picked the registered function, once for the step
    call = CALLS[0]
    trajectories = list(iter_trajectories(tmp_path / "run" / "trajectories" / "step-000001.jsonl"))
    assert call["rewards"].tolist() == [t.reward for t in trajectories]
    group_of = {g: n for n, g in enumerate(dict.fromkeys(t.group_id for t in trajectories))}
    assert call["groups"].tolist() == [group_of[t.group_id] for t in trajectories]
    assert set(call["out"].tolist()) <= {-1.0, 0.0, 1.0} and call["out"].abs().sum() > 0
    metrics = result.history[-1]
    assert metrics["batch/advantage_abs_mean"] == pytest.approx(float(call["out"].abs().mean()))
    trained = AutoModelForCausalLM.from_pretrained(result.final_model).state_dict()
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    assert any(not torch.equal(trained[k], initial[k]) for k in initial)


def test_the_config_checks_a_registered_estimator_by_its_declared_properties(
    toy: Estimator, tmp_path: Path
) -> None:
    config = _config(tmp_path, tmp_path, advantage=toy.name)
    assert validate_config(config).algorithm.estimator is toy
    config["rollout"]["samples_per_task"] = 1
    with pytest.raises(ConfigError, match="sign_of_gap compares samples of a task"):
        validate_config(config)
    with pytest.raises(ValueError, match="which sign_of_gap cannot be"):
        AlgorithmConfig(advantage=toy.name, credit="turn", dynamic_sampling=False)
    ADVANTAGES.register(
        Estimator(toy.name, sign_of_gap, turn_credit=True, without_dynamic_sampling="is a test"),
        replace=True,
    )
    assert toy.name in turn_estimators()
    assert AlgorithmConfig(advantage=toy.name, credit="turn", dynamic_sampling=False)
    with pytest.raises(ValueError, match="algorithm.advantage=sign_of_gap is a test: set"):
        AlgorithmConfig(advantage=toy.name)


def test_an_unregistered_name_is_refused_with_the_nearest_one() -> None:
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'sign_of_gap'"):
        AlgorithmConfig(advantage="sign_of_gap", dynamic_sampling=False)
    with pytest.raises(ValueError, match=r"unknown policy loss 'gpso' \(did you mean 'gspo'\?\)"):
        AlgorithmConfig(policy_loss="gpso")
    with pytest.raises(ValueError, match=r"unknown KL estimator 'k4'.*valid: k1, k2, k3"):
        AlgorithmConfig(kl_estimator="k4")


def test_registering_refuses_a_taken_name_and_an_unknown_input() -> None:
    registry: Registry[Algorithm] = Registry("thing", [Algorithm("a", len)])
    with pytest.raises(ConfigError, match="thing 'a' is already registered; pass replace=True"):
        registry.register(Algorithm("a", len))
    with pytest.raises(ConfigError, match=r"asks for unknown inputs \['ages'\]"):
        Estimator("e", len, inputs=frozenset({"ages"}))
    registry.unregister("a")
    assert list(registry) == []


@pytest.mark.parametrize("registry", REGISTRIES, ids=lambda r: r.family)
def test_every_built_in_name_resolves_to_a_function(registry: Registry[Any]) -> None:
    for name, entry in registry.items():
        assert callable(registry.function(name)), name
        assert entry.summary, name


def test_every_estimator_input_has_a_reader_in_scoring() -> None:
    assert set(scoring._INPUTS) == set(ESTIMATOR_INPUTS)


def test_the_config_validates_every_name_without_torch() -> None:
    probe = """
import json, sys
from envhub.trainer.config import AlgorithmConfig
from envhub.trainer.algorithms.registry import ADVANTAGES
for name, e in ADVANTAGES.items():
    AlgorithmConfig(advantage=name, dynamic_sampling=not e.without_dynamic_sampling)
print(json.dumps(sorted(m for m in ("torch", "transformers", "vllm") if m in sys.modules)))
"""
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []
