"""The dry run's size and memory estimate: a critic adds its weights, gradients and AdamW; the
activations match a hand computation and the table says what they assume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envhub.trainer.config import validate_config
from envhub.trainer.estimate import Activations, GiB, estimate


def _gib(text: str) -> float:
    return float(text.split(" GiB")[0])


def test_a_critic_adds_a_copy_of_the_weights_with_its_gradients_and_adamw(
    tiny_model_dir: Path,
) -> None:
    base = {"model": {"name": str(tiny_model_dir)}, "envs": [{"name": "arithmetic"}]}
    plain = estimate(validate_config(base))
    gae = {"advantage": "gae", "dynamic_sampling": False}
    with_critic = estimate(validate_config(base | {"algorithm": gae}))
    assert "critic (weights, gradients, AdamW)" not in plain
    params = float(plain["parameters"].split("M")[0]) * 1e6
    critic = _gib(with_critic["critic (weights, gradients, AdamW)"])
    assert abs(critic - params * 16 / GiB) < 0.01
    added = _gib(with_critic["total (rough)"]) - _gib(plain["total (rough)"])
    assert abs(added - critic) < 0.01


def _activations(name: str, **config: Any) -> Activations:
    from transformers import AutoConfig

    from envhub.trainer.models import resolve_model

    base = {"model": {"name": name}, "envs": [{"name": "arithmetic"}]}
    validated = validate_config(base | config)
    return Activations.of(validated, AutoConfig.from_pretrained(resolve_model(name)))


def test_smollm2_activations_by_hand() -> None:
    # What a user saw: "11 GiB" for a 135M model, without what it assumed. SmolLM2-135M: 30
    # layers, hidden 576, MLP 1536, vocab 49152; 4096 tokens in float32 on the CPU.
    act = _activations("smollm2-135m", backend={"device": "cpu", "micro_batch_tokens": 4096})
    per_token_layer = 8 * 576 + 4 * 1536  # 10,752 values
    assert act.layer_bytes == 4096 * 30 * per_token_layer * 4 == 5_284_823_040
    assert act.logit_bytes == 4096 * 49152 * 4 * 3 == 2_415_919_104
    assert act.describe() == "7.17 GiB (layers 4.92 GiB, logits 2.25 GiB)"
    assert act.assumptions() == (
        "4096 tokens per micro-batch (backend.micro_batch_tokens), float32 activations "
        "(model.dtype), recomputation off (model.gradient_checkpointing), 18.7 x hidden values "
        "per token and layer, float32 logits at every token (3 copies)"
    )
    # A quarter of the tokens: a quarter of everything. Recomputation: the 30 layer inputs
    # (576 values each) and one layer's full set, per token.
    recomputed = 4096 * (30 * 576 + per_token_layer) * 4 + 2_415_919_104
    assert act.knobs() == (
        f"backend.micro_batch_tokens=1024: {(5_284_823_040 + 2_415_919_104) / 4 / GiB:.2f} GiB; "
        f"model.gradient_checkpointing=true: {recomputed / GiB:.2f} GiB"
    )


def test_activation_dtype_follows_the_backend(tiny_model_dir: Path) -> None:
    model = str(tiny_model_dir)
    fp32 = _activations(model, backend={"device": "cpu", "micro_batch_tokens": 1024})
    bf16 = _activations(model, backend={"device": "cpu", "micro_batch_tokens": 1024},
                        model={"name": model, "dtype": "bfloat16"})  # fmt: skip
    assert (fp32.dtype, bf16.dtype) == ("float32", "bfloat16")
    assert fp32.layer_bytes == 1024 * 2 * (8 * 128 + 4 * 256) * 4  # 2 layers, hidden 128
    assert bf16.layer_bytes * 2 == fp32.layer_bytes and bf16.logit_bytes == fp32.logit_bytes
    megatron = _activations(model, backend={"kind": "megatron"}, rollout={"engine": "vllm"})
    assert megatron.dtype == "bfloat16"  # model.dtype auto: Megatron runs on GPUs


def test_the_dry_run_table_says_what_the_estimate_assumes(tiny_model_dir: Path) -> None:
    base = {"model": {"name": str(tiny_model_dir)}, "envs": [{"name": "arithmetic"}]}
    figures = estimate(validate_config(base | {"backend": {"device": "cpu"}}))
    keys = list(figures)
    at = keys.index("activations per micro-batch")
    assert keys[at : at + 3] == ["activations per micro-batch", "  assumes", "  to lower it"]
    assert figures["  to lower it"].startswith("backend.micro_batch_tokens=1024: ")
