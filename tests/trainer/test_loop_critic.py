"""PPO with a critic and ReMax through the real loop on a tiny random Llama: the critic learns
beside the policy, is checkpointed and resumed exactly, its warm-up leaves the policy alone,
and ReMax's greedy baselines reach every trajectory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

from envhub.rollout.io import iter_trajectories
from envhub.testing import LetterEnv
from envhub.trainer.config import validate_config
from envhub.trainer.loop import train

pytestmark = pytest.mark.usefixtures("letter_env")


def _config(model_dir: Path, out: Path, steps: int = 2, **algorithm: Any) -> Any:
    return validate_config(
        {
            "steps": steps,
            "seed": 3,
            "model": {"name": str(model_dir)},
            "envs": [{"name": LetterEnv.name}],
            "rollout": {"tasks_per_step": 2, "samples_per_task": 2, "max_tokens": 8},
            "algorithm": {
                "advantage": "gae",
                "lam": 0.95,
                "mismatch": "none",
                "dynamic_sampling": False,
                **algorithm,
            },
            "critic": {"lr": 1e-3, "micro_batch_tokens": 64},
            "optimizer": {"lr": 1e-3},
            "backend": {"device": "cpu", "micro_batch_tokens": 64},
            "logging": {"output_dir": str(out), "run_name": "run", "plot": False},
            "checkpoint": {"every": 1, "keep_last": 3},
        }
    )


@pytest.fixture(scope="module")
def ppo_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One two-step PPO run that two tests read (neither writes to its folder): what it logs
    and checkpoints, and the run a resumed one must equal."""
    import envhub
    from envhub import registry

    envhub.register(LetterEnv.name, LetterEnv, override=True)  # as ``letter_env`` does
    try:
        return train(_config(tiny_model_dir, tmp_path_factory.mktemp("straight")))
    finally:
        registry._registered.pop(LetterEnv.name, None)


def _critic_state(checkpoint: Path) -> dict[str, torch.Tensor]:
    model = AutoModelForTokenClassification.from_pretrained(checkpoint / "critic" / "model")
    return model.state_dict()


def test_ppo_trains_a_critic_beside_the_policy_and_checkpoints_it(ppo_run: Any) -> None:
    rows = ppo_run.history
    for row in rows:
        assert row["critic/value_loss"] > 0 and row["critic/grad_norm"] > 0
        assert row["critic/lr"] == 1e-3 and row["critic/warmup"] == 0.0
        assert row["train/grad_norm"] > 0  # the policy learned too
        assert row["time/values"] > 0 and row["time/critic"] > 0
    # Step 1's values come from the new head, zero everywhere; step 2's from the trained one.
    assert rows[0]["critic/values_mean"] == 0.0 and rows[1]["critic/values_mean"] != 0.0
    checkpoints = ppo_run.run_dir / "checkpoints"
    one, two = (
        _critic_state(checkpoints / "step-000001"),
        _critic_state(checkpoints / "step-000002"),
    )
    assert not torch.equal(one["score.weight"], two["score.weight"])
    for name in ("optimizer.pt", "scheduler.pt"):
        assert (checkpoints / "step-000002" / "critic" / name).is_file()


def test_a_resumed_ppo_run_continues_the_critic_exactly(
    ppo_run: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    train(_config(tiny_model_dir, tmp_path / "resumed", steps=1))
    result = train(_config(tiny_model_dir, tmp_path / "resumed", steps=2))
    assert result.resumed_from == 1
    straight = ppo_run.run_dir / "checkpoints" / "step-000002"
    resumed = tmp_path / "resumed" / "run" / "checkpoints" / "step-000002"
    for name, value in _critic_state(straight).items():
        assert torch.equal(_critic_state(resumed)[name], value), name
    a = AutoModelForCausalLM.from_pretrained(straight / "model").state_dict()
    b = AutoModelForCausalLM.from_pretrained(resumed / "model").state_dict()
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_during_the_critics_warmup_only_the_critic_learns(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    config = _config(tiny_model_dir, tmp_path, steps=1)
    config = config.model_copy(
        update={"critic": config.critic.model_copy(update={"warmup_steps": 1})}
    )
    result = train(config)
    row = result.history[0]
    assert row["critic/warmup"] == 1.0 and row["critic/value_loss"] > 0
    assert "train/loss" not in row  # no policy update
    trained = AutoModelForCausalLM.from_pretrained(result.final_model).state_dict()
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    assert all(torch.equal(trained[name], initial[name]) for name in initial)


def test_remax_baselines_each_sample_with_its_tasks_greedy_episode(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    result = train(_config(tiny_model_dir, tmp_path, steps=1, advantage="remax", lam=1.0))
    trajectories = list(iter_trajectories(tmp_path / "run" / "trajectories" / "step-000001.jsonl"))
    assert len(trajectories) == 4  # the greedy episodes are not trained on, nor saved as samples
    by_group: dict[str, set[float]] = {}
    for t in trajectories:
        assert t.baseline_reward is not None and 0.0 <= t.baseline_reward <= 1.0
        by_group.setdefault(t.group_id, set()).add(t.baseline_reward)
    assert all(len(b) == 1 for b in by_group.values())  # one greedy episode per task
    expected = sum(abs(t.reward - t.baseline_reward) for t in trajectories) / 4
    assert result.history[0]["batch/advantage_abs_mean"] == pytest.approx(expected, abs=1e-6)
    assert not any(key.startswith("critic/") for key in result.history[0])
    state = json.loads((tmp_path / "run" / "config.json").read_text())
    assert state["algorithm"]["advantage"] == "remax"
