"""Config loading: every shipped example validates; overrides and errors are exact."""

from __future__ import annotations

from pathlib import Path

import pytest

from envhub.errors import ConfigError
from envhub.trainer.config import TrainConfig, load_config

EXAMPLES_DIR = Path(__file__).parents[2] / "examples"
EXAMPLES = sorted(EXAMPLES_DIR.glob("*.yaml"))


def test_examples_exist() -> None:
    assert {p.name for p in EXAMPLES} >= {"quickstart.yaml", "gsm8k-1gpu.yaml"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_loads(path: Path) -> None:
    config = load_config(path)
    assert isinstance(config, TrainConfig)
    assert config.envs and config.steps >= 1


def test_quickstart_is_a_cpu_run_of_smollm2_on_arithmetic() -> None:
    config = load_config(EXAMPLES_DIR / "quickstart.yaml")
    assert (config.model.name, config.envs[0].name, config.rollout.engine) == (
        "smollm2-135m",
        "arithmetic",
        "hf",
    )
    assert config.run_dir == Path("outputs/train/quickstart")


def test_overrides_parse_yaml_values_and_index_lists(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("envs:\n  - name: arithmetic\n")
    config = load_config(
        path,
        [
            "optimizer.lr=3e-6",
            "steps=7",
            "envs.0.args.difficulty=hard",
            "algorithm.dual_clip=3",
            "logging.tensorboard=true",
        ],
    )
    assert config.optimizer.lr == 3e-6
    assert config.steps == 7
    assert config.envs[0].args == {"difficulty": "hard"}
    assert config.algorithm.dual_clip == 3.0
    assert config.logging.tensorboard is True


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["optimizer.lrr=1"], "unknown config key 'optimizer.lrr' (did you mean 'lr'?)"),
        (["stepz=3"], "unknown config key 'stepz' (did you mean 'steps'?)"),
        (["steps"], "override 'steps' must look like section.key=value"),
        (["envs.3.name=x"], "override envs.3.name: envs has no item 3"),
        (["steps=abc"], "steps: Input should be a valid integer"),
        (
            ["rollout.samples_per_task=1"],
            "grpo compares samples of a task: set rollout.samples_per_task >= 2",
        ),
        (
            ["algorithm.advantage=ppo"],
            "algorithm.advantage: Input should be "
            "'grpo', 'dr_grpo', 'rloo', 'reinforce++' or 'reinforce++_baseline'",
        ),
        (
            ["algorithm.overlong.soft_penalty_buffer=64"],
            "soft_penalty_buffer must be smaller than rollout.max_tokens",
        ),
        (
            ["rollout.top_p=0.9"],
            "rollout.top_p < 1 and rollout.top_k truncate the sampler's distribution",
        ),
        (["rollout.top_k=50"], "train with rollout.top_p=1 and no top_k"),
        (
            ["rollout.max_staleness=1"],
            "rollout.max_staleness >= 1 samples while the trainer updates, which needs "
            "rollout.engine=vllm",
        ),
        (
            ["rollout.engine=vllm", "rollout.max_staleness=2", "rollout.vllm.sleep='on'"],
            "set rollout.vllm.sleep=auto or off",
        ),
        (
            ["rollout.vllm.weight_transfer=ncl"],
            "unknown weight transfer 'ncl' (did you mean 'nccl'?); available: auto, envhub_shm",
        ),
    ],
)
def test_invalid_configs_fail_before_any_work(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(EXAMPLES_DIR / "quickstart.yaml", overrides)
    assert message in str(info.value)


def test_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: [1,\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config(bad)
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(listed)


def test_envs_are_required() -> None:
    with pytest.raises(ConfigError, match="envs: Field required"):
        load_config(None, [])
