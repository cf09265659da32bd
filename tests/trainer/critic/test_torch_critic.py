"""The torch critic on a tiny random Llama: its values are the token classifier's outputs at the
right places, its update does not depend on the micro-batch split, and a checkpoint gives it
back exactly (model, optimizer, scheduler)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForTokenClassification

from envhub.errors import CheckpointError, ConfigError
from envhub.trainer.batch import Sample
from envhub.trainer.checkpoint import CheckpointManager
from envhub.trainer.config import validate_config
from envhub.trainer.critic.targets import ValueTarget
from envhub.trainer.critic.torch_critic import TorchCritic

SEQUENCES = [[1, 5, 9, 13, 2], [7, 3], [4, 4, 4, 8, 6, 1, 2, 9], [11, 12, 13]]


def _critic(model_dir: Path, budget: int = 4096, **critic: object) -> TorchCritic:
    config = validate_config(
        {
            "model": {"name": str(model_dir)},
            "envs": [{"name": "arithmetic"}],
            "algorithm": {"advantage": "gae", "dynamic_sampling": False},
            "rollout": {"samples_per_task": 1},
            "critic": {"lr": 1e-3, "value_clip": 0.2, "micro_batch_tokens": budget, **critic},
        }
    )
    torch.manual_seed(0)  # the value head's initialisation
    return TorchCritic(config, torch.device("cpu"), None)


def _samples(critic: TorchCritic) -> list[Sample]:
    values = critic.values(SEQUENCES)
    samples = []
    for k, (ids, old) in enumerate(zip(SEQUENCES, values, strict=True)):
        mask = torch.tensor([i % 2 == 0 for i in range(len(ids) - 1)])
        returns = torch.linspace(-1.0, 1.0, len(ids) - 1, dtype=torch.float64) * (k + 1)
        target = ValueTarget(old, returns, mask)
        samples.append(
            Sample(ids, [0] + [1] * (len(ids) - 1), [0.0] * len(ids), 0.0, k, None, target)
        )
    return samples


def test_values_are_the_value_heads_outputs_before_each_next_token(tiny_model_dir: Path) -> None:
    critic = _critic(tiny_model_dir, budget=16)  # several padded micro-batches
    values = critic.values(SEQUENCES)
    assert [v.shape for v in values] == [torch.Size([len(s) - 1]) for s in SEQUENCES]
    model = critic.model.eval()
    for ids, got in zip(SEQUENCES, values, strict=True):
        with torch.no_grad():
            alone = model(input_ids=torch.tensor([ids])).logits[0, :-1, 0]
        assert torch.allclose(got.float(), alone, atol=1e-5), ids
    # A fresh head on the policy's trunk: the trunk's weights are the policy's own.
    assert isinstance(model, AutoModelForTokenClassification._model_mapping[type(model.config)])


def test_the_update_does_not_depend_on_the_micro_batch_split(tiny_model_dir: Path) -> None:
    results = []
    for budget in (4096, 16):
        critic = _critic(tiny_model_dir, budget=budget)
        metrics = critic.update(_samples(critic))
        results.append((metrics, {k: v.clone() for k, v in critic.model.state_dict().items()}))
    (whole, whole_state), (split, split_state) = results
    assert split["value_loss"] == pytest.approx(whole["value_loss"], abs=1e-6)
    assert split["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-5)
    assert split["value_clip_frac"] == pytest.approx(whole["value_clip_frac"], abs=1e-6)
    assert whole["value_loss"] > 0 and whole["lr"] == 1e-3
    for name, value in whole_state.items():
        # AdamW's first step moves each weight by ~lr * sign(grad): where a gradient is as small
        # as Adam's eps, float rounding of the split shifts it a little (as in test_loop.py).
        difference = (split_state[name] - value).abs()
        assert difference.max().item() < 1e-5 and difference.mean().item() < 1e-7, name


def test_an_update_moves_the_values_towards_the_returns(tiny_model_dir: Path) -> None:
    critic = _critic(tiny_model_dir, value_clip=None)
    samples = _samples(critic)
    errors = []
    for _ in range(3):
        errors.append(critic.update(samples)["value_error"])
    assert errors[2] < errors[0]


def test_a_checkpoint_gives_the_critic_back_exactly(tiny_model_dir: Path, tmp_path: Path) -> None:
    critic = _critic(tiny_model_dir)
    critic.update(_samples(critic))
    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    manager = CheckpointManager(tmp_path / "checkpoints")
    folder = manager.save(1, model=policy, trainer_state={"step": 1}, critic=critic.state())
    assert (folder / "critic" / "model" / "config.json").is_file()

    fresh = _critic(tiny_model_dir)
    assert not torch.equal(fresh.model.score.weight, critic.model.score.weight)
    manager.load(folder, model=policy, critic=fresh.state())
    for name, value in critic.model.state_dict().items():
        assert torch.equal(fresh.model.state_dict()[name], value), name
    saved, loaded = critic.optimizer.state_dict(), fresh.optimizer.state_dict()
    for key, state in saved["state"].items():
        assert torch.equal(loaded["state"][key]["exp_avg"], state["exp_avg"])
    assert fresh.values(SEQUENCES)[0].tolist() == critic.values(SEQUENCES)[0].tolist()

    bare = manager.save(2, model=policy, trainer_state={"step": 2})
    with pytest.raises(CheckpointError, match="holds no critic"):
        manager.load(bare, model=policy, critic=fresh.state())


def test_a_critic_model_that_cannot_load_says_what_to_use(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')  # and no weights
    with pytest.raises(ConfigError, match=r"cannot load critic model .* Set critic.model to"):
        _critic(tiny_model_dir, model=str(tmp_path))
