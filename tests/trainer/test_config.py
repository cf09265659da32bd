"""Config loading: every shipped example validates; overrides and errors are exact."""

from __future__ import annotations

from pathlib import Path

import pytest

from envhub import examples
from envhub.errors import ConfigError
from envhub.trainer.config import TrainConfig, load_config, unknown_keys, validate_config

# The shipped examples, from the installed package (``envhub.examples``; ``examples/`` in a
# checkout is that same folder).
EXAMPLES_DIR = examples.FOLDER
EXAMPLES = [examples.path(name) for name in examples.names()]


def test_examples_exist() -> None:
    assert {p.name for p in EXAMPLES} >= {"quickstart.yaml", "gsm8k-1gpu.yaml"}
    assert EXAMPLES_DIR.resolve() == (Path(__file__).parents[2] / "examples").resolve()


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


def test_a_run_on_overridden_envs_is_not_the_configs_run() -> None:
    # What a user saw: their env's run landed in outputs/train/quickstart (resume: auto could
    # resume the arithmetic run), evaluated arithmetic, and got the arithmetic env's args.
    notes: list[str] = []
    config = load_config(
        EXAMPLES_DIR / "quickstart.yaml", ["envs.0.name=examples/envs/lookup_sum.py"], notes
    )
    assert config.run_dir == Path("outputs/train/lookup_sum-smollm2-135m")
    assert (config.envs[0].args, config.eval) == ({}, None)
    assert notes == [
        "envs.0 is now examples/envs/lookup_sum.py, so arithmetic's args {'difficulty': 'tiny'} "
        "are dropped (envs.0.args.KEY=VALUE to give some)",
        "the envs were overridden, so the run is not named 'quickstart' as the config's envs' "
        "run is (logging.run_name=NAME to choose)",
        "the envs were overridden, so the config's held-out evaluation on arithmetic is dropped "
        "(eval.envs=[...] to evaluate)",
    ]


@pytest.mark.parametrize(
    ("overrides", "run_name", "args", "evaluated"),
    [
        (["envs.0.args.difficulty=easy"], "quickstart", {"difficulty": "easy"}, True),
        (["envs.0.name=arithmetic"], "quickstart", {"difficulty": "tiny"}, True),
        (
            ["envs.0.name=examples/envs/lookup_sum.py", "logging.run_name=mine"],
            "mine",
            {},
            False,
        ),
        (
            ["envs=[{name: examples/envs/lookup_sum.py, args: {a: 1}}]", "eval.envs.0.args={}"],
            "lookup_sum-smollm2-135m",
            {"a": 1},
            True,
        ),
        (
            ["envs.0.name=examples/envs/lookup_sum.py", "logging.output_dir=x", "eval.every=2"],
            "lookup_sum-smollm2-135m",
            {},
            False,
        ),
    ],
    ids=["args-only", "same-name", "run-name-given", "eval-given", "other-logging-and-eval"],
)
def test_what_the_user_overrides_too_stays(
    overrides: list[str], run_name: str, args: dict, evaluated: bool
) -> None:
    config = load_config(EXAMPLES_DIR / "quickstart.yaml", overrides)
    assert (config.run_name, config.envs[0].args, config.eval is not None) == (
        run_name,
        args,
        evaluated,
    )


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
            "algorithm.advantage: Value error, unknown advantage estimator 'ppo' (did you mean "
            "'opo'?); valid: dr_grpo, gae, gpg, grpo, opo, reinforce++, reinforce++_baseline, "
            "remax, rloo",
        ),
        (["algorithm.advantage=gae"], "takes its baseline from the critic, not from the group"),
        (["algorithm.advantage=remax"], "takes its baseline from a greedy episode"),
        (["algorithm.lam=0.9"], "algorithm.lam and algorithm.gae_unit shape GAE"),
        (["algorithm.gae_unit=turn"], "they need algorithm.advantage=gae"),
        (
            [
                "algorithm.advantage=remax",
                "algorithm.dynamic_sampling=false",
                "algorithm.credit=turn",
            ],
            "which remax cannot be (it is defined on whole sequences)",
        ),
        (["critic.value_clip=0"], "critic.value_clip: Input should be greater than 0"),
        (
            ["algorithm.credit=turn", "algorithm.advantage=opo"],
            "algorithm.credit=turn applies the estimator per turn, which opo cannot be",
        ),
        (
            [
                "algorithm.credit=turn",
                "algorithm.advantage=gpg",
                "algorithm.dynamic_sampling=false",
            ],
            "which gpg cannot be (it is defined on whole sequences)",
        ),
        (["algorithm.credit=step"], "algorithm.credit: Input should be 'episode' or 'turn'"),
        (["algorithm.gamma=0.9"], "algorithm.gamma discounts per-turn returns"),
        (
            ["algorithm.credit=turn", "algorithm.gamma=0"],
            "algorithm.gamma: Input should be greater than 0",
        ),
        (
            ["algorithm.credit=turn", "algorithm.gamma=1.5"],
            "algorithm.gamma: Input should be less than or equal to 1",
        ),
        (["algorithm.advantage=gpg"], "set algorithm.dynamic_sampling=false"),
        (
            ["algorithm.advantage=opo", "rollout.samples_per_task=1"],
            "opo compares samples of a task",
        ),
        (
            ["algorithm.kl_in_reward={type: adaptive, coef: 0.1}"],
            "kl_in_reward.type=adaptive needs target_kl and horizon",
        ),
        (
            ["algorithm.kl_in_reward={coef: 0.1, target_kl: 0.5}"],
            "target_kl and horizon steer an adaptive coefficient",
        ),
        (
            ["algorithm.kl_in_reward={type: pid}"],
            "algorithm.kl_in_reward.type: Input should be 'fixed' or 'adaptive'",
        ),
        (
            ["algorithm.kl_in_reward={coef: -1}"],
            "algorithm.kl_in_reward.coef: Input should be greater than or equal to 0",
        ),
        (["algorithm.kl_in_reward={coefficient: 1}"], "algorithm.kl_in_reward.coefficient"),
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


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        (
            "envs: [{name: arithmetic}]\nrollout: {task_per_step: 4}\n",
            "unknown config key 'rollout.task_per_step' (did you mean 'tasks_per_step'?)",
        ),
        (
            "envs: [{name: arithmetic}]\nrolout: {tasks_per_step: 4}\n",
            "unknown config key 'rolout' (did you mean 'rollout'?)",
        ),
        (
            "envs: [{name: arithmetic}]\nalgorithm: {overlong: {filtr: true}}\n",
            "unknown config key 'algorithm.overlong.filtr' (did you mean 'filter'?)",
        ),
        (
            "envs: [{name: arithmetic}, {nme: gsm8k}]\n",
            "unknown config key 'envs.1.nme' (did you mean 'name'?)",
        ),
        (
            "envs: [{name: arithmetic}]\nmodel: {lora: {rnak: 8}}\n",
            "unknown config key 'model.lora.rnak' (did you mean 'rank'?)",
        ),
        (
            "envs: [{name: arithmetic}]\nxyzzy: 1\n",
            "unknown config key 'xyzzy' (valid: steps, seed, model, envs, rollout, algorithm, "
            "critic, optimizer, backend, cluster, logging, checkpoint, eval, curriculum, sft, "
            "distill)",
        ),
        (
            "envs: [{name: arithmetic}]\nsetps: 3\noptimizer: {lrr: 1.0e-6}\n",
            "unknown config key 'setps' (did you mean 'steps'?)\n"
            "unknown config key 'optimizer.lrr' (did you mean 'lr'?)",
        ),
    ],
    ids=["nested", "top-level", "depth-3", "list-item", "optional-part", "no-match", "several"],
)
def test_unknown_yaml_keys_are_named_with_the_nearest_valid_key(
    yaml_text: str, message: str, tmp_path: Path
) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == message


def test_an_override_typo_reads_the_same_as_the_yaml_typo(tmp_path: Path) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text("envs: [{name: arithmetic}]\nrollout: {task_per_step: 4}\n")
    with pytest.raises(ConfigError) as from_yaml:
        load_config(path)
    with pytest.raises(ConfigError) as from_override:
        load_config(EXAMPLES_DIR / "quickstart.yaml", ["rollout.task_per_step=4"])
    with pytest.raises(ConfigError) as from_dict:
        validate_config({"envs": [{"name": "arithmetic"}], "rollout": {"task_per_step": 4}})
    assert str(from_yaml.value) == str(from_override.value) == str(from_dict.value)


def test_env_args_are_the_envs_own_and_not_checked_here() -> None:
    # An env's constructor checks its keyword arguments (and lists the ones it accepts) when the
    # run makes it; the config cannot know them without importing the env.
    data = {"envs": [{"name": "arithmetic", "args": {"dificulty": "easy"}}]}
    assert unknown_keys(data) == []
    assert validate_config(data).envs[0].args == {"dificulty": "easy"}


def test_gae_takes_a_discount_per_step_and_one_sample_per_task() -> None:
    config = validate_config(
        {
            "envs": [{"name": "guess-number"}],
            "rollout": {"samples_per_task": 1},
            "algorithm": {
                "advantage": "gae",
                "dynamic_sampling": False,
                "gamma": 0.99,
                "lam": 0.95,
                "gae_unit": "turn",
            },
            "critic": {"lr": 2e-6, "warmup_steps": 2},
        }
    )
    assert config.algorithm.needs_critic and not config.algorithm.needs_reference
    assert (config.critic.lr, config.critic.warmup_steps, config.critic.value_clip) == (
        2e-6,
        2,
        0.5,
    )
