"""On-policy distillation on tiny random Llamas: a step with a local teacher alone equals a
hand-written update on the per-token reverse-KL advantages; at a coefficient of 0 the run is
plain GRPO, exactly; a teacher with another tokenizer is refused at start."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from transformers import AutoModelForCausalLM

from envhub.errors import ConfigError
from envhub.rollout.io import iter_trajectories
from envhub.testing import LetterEnv
from envhub.trainer.config import validate_config
from envhub.trainer.distill.teachers import LocalTeacher
from envhub.trainer.loop import train

pytestmark = pytest.mark.usefixtures("letter_env")


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    """The tiny Llama's shape and tokenizer with other random weights (seed 1)."""
    target = tmp_path_factory.mktemp("tiny-teacher")
    config = transformers.AutoConfig.from_pretrained(tiny_model_dir)
    torch.manual_seed(1)
    transformers.LlamaForCausalLM(config).save_pretrained(target)
    transformers.AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(target)
    return target


def _config(model_dir: Path, out: Path, **distill: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "steps": 1,
        "seed": 7,
        "model": {"name": str(model_dir)},
        "envs": [{"name": LetterEnv.name}],
        "rollout": {"tasks_per_step": 2, "samples_per_task": 2, "max_tokens": 6},
        "algorithm": {"mismatch": "none", "dynamic_sampling": False},
        "optimizer": {"lr": 1e-3, "grad_clip": 1.0},
        "backend": {"device": "cpu", "micro_batch_tokens": 256},
        "logging": {"output_dir": str(out), "run_name": "run", "plot": False},
        "checkpoint": {"every": 1},
    }
    if distill:
        config["distill"] = distill
    return config


def _logprobs(model: Any, ids: list[int]) -> torch.Tensor:
    tokens = torch.tensor([ids])
    logits = model(input_ids=tokens).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, tokens[0, 1:, None])[:, 0]


def test_a_step_with_a_teacher_alone_equals_a_hand_written_update(
    tiny_model_dir: Path, teacher_dir: Path, tmp_path: Path
) -> None:
    teacher = {"kind": "local", "model": str(teacher_dir)}
    result = train(validate_config(_config(tiny_model_dir, tmp_path, teacher=teacher,
                                           weight=0.5, reward_weight=0.0)))  # fmt: skip
    trajectories = list(iter_trajectories(tmp_path / "run" / "trajectories" / "step-000001.jsonl"))
    # Written plainly: advantage_t = 0.5 x (teacher logprob - sampler logprob) on each sampled
    # token, PPO at ratio 1, token-mean over the batch, clip, one AdamW step.
    student = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    scorer = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32)
    num_tokens = sum(sum(t.loss_mask[1:]) for t in trajectories)
    for t in trajectories:
        mask = torch.tensor(t.loss_mask[1:], dtype=torch.float32)
        with torch.no_grad():
            teacher_lp = _logprobs(scorer, t.token_ids)
        advantages = 0.5 * (teacher_lp - torch.tensor(t.sampler_logprobs[1:])) * mask
        logprobs = _logprobs(student, t.token_ids)
        ratio = torch.exp(logprobs - logprobs.detach())
        (-(advantages * ratio * mask).sum() / num_tokens).backward()
    torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
    torch.optim.AdamW(student.parameters(), lr=1e-3, weight_decay=0.0).step()
    trained = AutoModelForCausalLM.from_pretrained(result.final_model, dtype=torch.float32)
    got = trained.state_dict()
    for name, value in student.state_dict().items():
        difference = (got[name] - value).abs()
        assert difference.mean().item() < 1e-6, name  # 0.1% of lr: Adam moves each by ~lr
        assert (difference > 1e-6).float().mean().item() < 1e-3, name
    row = result.history[0]
    assert row["distill/weight"] == 0.5 and row["distill/reverse_kl"] > 0
    assert row["time/teacher"] > 0


def test_at_a_coefficient_of_zero_the_run_is_plain_grpo(
    tiny_model_dir: Path, teacher_dir: Path, tmp_path: Path
) -> None:
    plain = train(validate_config(_config(tiny_model_dir, tmp_path / "plain")))
    teacher = {"kind": "local", "model": str(teacher_dir)}
    # One RL step: the linear schedule's first coefficient, 0.
    mixed = train(validate_config(_config(
        tiny_model_dir, tmp_path / "mixed", teacher=teacher, weight=0.0, final_weight=1.0,
        schedule="linear",
    )))  # fmt: skip
    a = AutoModelForCausalLM.from_pretrained(plain.final_model, dtype=torch.float32).state_dict()
    b = AutoModelForCausalLM.from_pretrained(mixed.final_model, dtype=torch.float32).state_dict()
    assert all(torch.equal(a[name], b[name]) for name in a)
    (row_a,), (row_b,) = plain.history, mixed.history
    assert row_b["distill/weight"] == 0.0 and row_a["train/loss"] == row_b["train/loss"]


def test_a_local_teacher_with_another_vocabulary_is_refused(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    shutil.copytree(tiny_model_dir, other)
    tokenizer = transformers.AutoTokenizer.from_pretrained(other)
    tokenizer.add_tokens(["<teacher-only>"])
    tokenizer.save_pretrained(other)
    policy_tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    with pytest.raises(ConfigError, match=r"reads token 49152 as '<teacher-only>'"):
        asyncio.run(LocalTeacher(str(other), "cpu").start(policy_tokenizer))
