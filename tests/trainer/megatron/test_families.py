"""The model families the Megatron backend names beside Llama (``test_worker.py``): a tiny Qwen2
(biased query/key/value projections) and a tiny Qwen3 (query/key norms), random weights with
non-zero biases and norms, go HF -> Megatron -> HF bit for bit under TP=2 (real megatron-core and
mbridge over gloo), and the Megatron shards score a sequence as transformers does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core")
pytest.importorskip("mbridge")

import transformers  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from envhub.defaults import free_port

HERE = Path(__file__).resolve().parent
SHAPE = {
    "vocab_size": 512, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 64,
    "max_position_embeddings": 256, "tie_word_embeddings": True,
}  # fmt: skip
FAMILIES = {"qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}


def _tiny_model(family: str, folder: Path) -> Path:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(FAMILIES[family](**SHAPE))
    with torch.no_grad():  # a bias or norm the conversion dropped would then show
        for name, parameter in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                parameter.normal_(mean=0.0 if name.endswith("bias") else 1.0, std=0.1)
    model.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_family_converts_exactly_and_scores_as_transformers(family: str, tmp_path: Path) -> None:
    model_dir = _tiny_model(family, tmp_path / family)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "ENVHUB_MEGATRON_WORKER_SETUP": str(HERE / "cpu_compat.py"),
    }
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
               f"--master-port={free_port()}", str(HERE / "family_main.py"), str(model_dir),
               str(tmp_path / "rank0.pt"), "2"]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    record = torch.load(tmp_path / "rank0.pt")

    original = load_file(model_dir / "model.safetensors")
    assert set(record["weights"]) == set(original) - {"lm_head.weight"}  # tied: exported once
    assert any(name.endswith("q_proj.bias") for name in original) == (family == "qwen2")
    assert any(name.endswith("q_norm.weight") for name in original) == (family == "qwen3")
    for name, tensor in record["weights"].items():
        assert torch.equal(tensor, original[name]), name

    ids = torch.tensor([list(range(3, 40))])
    with torch.no_grad():
        logits = (
            transformers.AutoModelForCausalLM.from_pretrained(model_dir)(ids).logits[0, :-1].float()
        )
    expected = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
    torch.testing.assert_close(record["logprobs"][: len(expected)], expected, atol=1e-5, rtol=0)
