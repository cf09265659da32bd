"""Provenance from the trainer's engines: what sampled each turn, recorded by the real rollout
runner (a tiny random Llama with SmolLM2's tokenizer and chat template)."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest

import envhub
from envhub.inference.base import SamplingParams
from envhub.rollout.runner import RolloutRunner
from envhub.types import SamplerRef

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from envhub.trainer.engines import HFEngine  # noqa: E402


def test_hf_trajectories_record_the_engine_model_version_sampling_and_template(
    tiny_model_dir: Path,
) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    model = transformers.LlamaForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    sampling = SamplingParams(temperature=0.5, max_tokens=4)
    runner = RolloutRunner(
        HFEngine(model, tokenizer, seed=0), lambda: envhub.make("arithmetic"), sampling=sampling
    )
    (trajectory,) = asyncio.run(runner.run([0]))
    assert isinstance(tokenizer.chat_template, str) and tokenizer.chat_template
    assert trajectory.sampler == SamplerRef(
        engine="hf",
        model=str(tiny_model_dir),
        version=transformers.__version__,
        sampling={"temperature": 0.5, "top_p": 1.0, "top_k": None, "max_tokens": 4,
                  "stop": [], "seed": None, "logprobs": True},
        chat_template_sha256=hashlib.sha256(tokenizer.chat_template.encode()).hexdigest(),
    )  # fmt: skip
    assert runner.sampler == trajectory.sampler
