"""``envhub.train``: the Python entry point, on a tiny real CPU run, with an env class from a
file; the run's ``config.json`` keeps the file's reference, so a resumed run finds the env."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import envhub
from envhub import registry
from envhub.errors import EnvNotFoundError
from envhub.references import load_reference
from envhub.trainer.api import build_config

pytest.importorskip("torch")

LETTERS = """from envhub.testing import LetterEnv


class Letters(LetterEnv):
    \"\"\"LetterEnv, written in a file of its own.\"\"\"
"""


def tiny_run(model_dir: Path, out: Path) -> dict[str, Any]:
    """The cheapest real run (tests/trainer/test_loop.py's): one step, 2 tasks x 4 samples."""
    return {
        "steps": 1,
        "seed": 3,
        "model": {"name": str(model_dir)},
        "rollout": {"tasks_per_step": 2, "samples_per_task": 4, "max_tokens": 8},
        "algorithm": {"mismatch": "none", "dynamic_sampling": True},
        "optimizer": {"lr": 1e-3, "grad_clip": 1.0},
        "backend": {"device": "cpu", "micro_batch_tokens": 64},
        "logging": {"output_dir": str(out), "run_name": "run", "plot": False},
        "checkpoint": {"every": 1, "keep_last": 2, "export_hf": False},
    }


@pytest.fixture
def letters_file(tmp_path: Path) -> Path:
    path = tmp_path / "letters.py"
    path.write_text(LETTERS)
    return path


def test_train_runs_an_env_class_and_a_resume_finds_it_from_the_saved_config(
    tiny_model_dir: Path, letters_file: Path, tmp_path: Path
) -> None:
    letters = load_reference(f"{letters_file}:Letters")
    result = envhub.train(tiny_run(tiny_model_dir, tmp_path / "out"), envs=[letters])
    assert result.run_dir == tmp_path / "out" / "run"
    assert [row["step"] for row in result.history] == [1]
    assert (
        result.final_metrics is result.history[-1]
        and 0.0 <= result.final_metrics["reward/mean"] <= 1.0
    )
    saved = json.loads((result.run_dir / "config.json").read_text())
    assert saved["envs"] == [{"name": f"{letters_file}:Letters", "args": {}, "weight": 1.0}]

    resumed = envhub.train(saved, ["steps=2"])  # as `envhub train config.json steps=2` would
    assert resumed.resumed_from == 1
    assert [row["step"] for row in resumed.history] == [1, 2]


def test_overrides_take_dotted_keys_as_strings_or_a_mapping(letters_file: Path) -> None:
    base = {"envs": [str(letters_file)], "logging": {"run_name": "x"}}
    as_strings = build_config(base, ["optimizer.lr=2e-6", "rollout.samples_per_task=4"])
    as_mapping = build_config(base, {"optimizer.lr": 2e-6, "rollout.samples_per_task": 4})
    assert as_strings == as_mapping
    assert (as_strings.optimizer.lr, as_strings.envs[0].name) == (2e-6, str(letters_file))
    assert build_config(as_strings, steps=3).steps == 3  # a TrainConfig, with a field replaced


def test_an_env_instance_is_copied_for_each_episode(letters_file: Path) -> None:
    letters = load_reference(f"{letters_file}:Letters")
    instance = letters()
    instance.pass_threshold = 0.5  # a setting of this instance that copies keep
    try:
        config = build_config(envs=[{"name": instance, "weight": 2.0}])
        assert (config.envs[0].name, config.envs[0].weight, config.run_name) == (
            "letters",
            2.0,
            "letters-smollm2-135m",
        )
        first, second = envhub.make("letters"), envhub.make("letters")
        assert first is not second and first is not instance
        assert (type(first), first.pass_threshold) == (letters, 0.5)
    finally:
        registry._registered.pop("letters", None)


def test_a_bad_env_fails_before_any_model_loads(tmp_path: Path) -> None:
    with pytest.raises(EnvNotFoundError) as raised:
        envhub.train(tiny_run(tmp_path / "no-model", tmp_path), envs=["arithmatic"])
    assert str(raised.value).startswith(
        "envs.0.name: no env named 'arithmatic'. Did you mean 'arithmetic'?"
    )
