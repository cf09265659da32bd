"""End to end: a model trained by `envhub train` and exported as an HF folder is served by real
vLLM, and vLLM's logprobs of what it samples are the trainer's own (same weights, same math).

The model is the tiny random Llama of ``tests/conftest.py`` (head_dim 64, which vLLM's CPU
attention needs). It trains on ``envhub.testing.LetterEnv``, whose reward is continuous (the
share of ``e``), so a random model's groups have variance, and one GRPO step at a large learning
rate moves its weights far enough that the logprobs of the untrained model would not match.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from envhub.inference.vllm_server import VLLMServer
from envhub.rollout.io import read_trajectories
from envhub.trainer.config import load_config
from envhub.trainer.loop import train

pytestmark = [pytest.mark.vllm, pytest.mark.model]

ROOT = Path(__file__).resolve().parents[2]


def hf_logprobs(model_dir: Path, token_ids: list[int]) -> torch.Tensor:
    """Logprob of each token after the first under the HF model at temperature 1."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]


def test_an_exported_model_serves_on_vllm_with_the_trainers_logprobs(
    require_vllm, letter_env: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    config = load_config(ROOT / "examples" / "quickstart.yaml", [
        f"envs.0.name={letter_env}", "envs.0.args={}", f"model.name={tiny_model_dir}", "steps=1",
        "rollout.tasks_per_step=2", "rollout.samples_per_task=4", "rollout.max_tokens=8",
        "optimizer.lr=1e-2", "algorithm.dynamic_sampling=false", "backend.device=cpu",
        f"logging.output_dir={tmp_path}", "logging.run_name=run", "logging.plot=false",
        "eval=null",
    ])  # fmt: skip
    run = train(config)
    assert run.history[0]["batch/kept"] == 8 and run.history[0]["train/grad_norm"] > 0
    final = run.final_model
    assert (
        final is not None
        and json.loads((final / "config.json").read_text())["num_hidden_layers"] == 2
    )

    # fp32 like the trainer: vLLM's "auto" dtype would serve a float32 checkpoint in bfloat16
    with VLLMServer(
        str(final),
        served_model_name="trained",
        extra_args=["--dtype", "float32", "--enforce-eager"],
    ) as server:
        out = tmp_path / "eval"
        result = subprocess.run(
            [sys.executable, "-m", "envhub.cli", "eval", "arithmetic",
             "-u", f"{server.base_url}/v1", "-m", "trained", "-a", "difficulty=tiny",
             "-n", "3", "-r", "2", "--max-tokens", "12", "--temperature", "1.0", "-o", str(out)],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    trajectories = read_trajectories(out / "trajectories.jsonl")
    assert len(trajectories) == 6
    trained_diffs, untrained_diffs = [], []
    for t in trajectories:
        positions = [i for i, m in enumerate(t.loss_mask[1:]) if m]
        assert positions, "nothing was sampled"
        sampled = torch.tensor([t.sampler_logprobs[i + 1] for i in positions])
        trained_diffs.append((hf_logprobs(final, t.token_ids)[positions] - sampled).abs())
        untrained_diffs.append(
            (hf_logprobs(tiny_model_dir, t.token_ids)[positions] - sampled).abs()
        )
    trained, untrained = torch.cat(trained_diffs), torch.cat(untrained_diffs)
    assert trained.max().item() < 1e-3, (
        f"vLLM does not serve the exported weights: max |diff| {trained.max():.2e}"
    )
    assert (
        untrained.mean().item() > 100 * trained.mean().item()
    )  # the step really changed the model
