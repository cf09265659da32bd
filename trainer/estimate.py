"""A size and memory estimate of a run, from the model's config alone (no weights loaded).

Rough by design: it tells a 135M CPU run from a 7B run that will not fit, before anything
starts. Training memory = parameters (fp32 master copy) + gradients + AdamW's two moments for
trainable parameters, + a reference model when the KL penalty is on, + a critic (another copy
of the weights, its gradients and AdamW moments, no vocabulary logits) with ``advantage: gae``,
+ activations of one micro-batch (the logits over the vocabulary dominate for small models),
+ the generation KV cache.
"""

from __future__ import annotations

from typing import Any

import torch

from envhub.errors import ConfigError
from envhub.trainer.config import TrainConfig
from envhub.trainer.models import resolve_model

GiB = 1024**3


def count_parameters(config: Any) -> int:
    """Parameters of the model an HF config describes, built on the meta device (no memory)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def estimate(config: TrainConfig) -> dict[str, str]:
    """Human-readable size, token and memory figures for ``config``."""
    from transformers import AutoConfig

    try:
        hf = AutoConfig.from_pretrained(resolve_model(config.model.name))
    except OSError as e:
        raise ConfigError(f"cannot read the config of model {config.model.name!r}: {e}") from None
    params = count_parameters(hf)
    trainable = _trainable(params, hf, config)
    rc = config.rollout
    episodes = rc.tasks_per_step * rc.samples_per_task
    hidden, layers, vocab = hf.hidden_size, hf.num_hidden_layers, hf.vocab_size
    tokens = config.backend.micro_batch_tokens
    weights = params * 4 * (2 if config.algorithm.needs_reference else 1)
    optimizer = trainable * (4 + 8)
    logits = tokens * vocab * 4 * 3
    activations = tokens * hidden * layers * 34 * (1 if config.model.gradient_checkpointing else 4)
    kv_heads = getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads
    head_dim = getattr(hf, "head_dim", None) or hidden // hf.num_attention_heads
    context = 1024 + rc.max_tokens
    kv_cache = min(rc.max_concurrency, episodes) * context * 2 * layers * kv_heads * head_dim * 4
    critic = params * (4 + 4 + 8) if config.algorithm.needs_critic else 0
    total = weights + optimizer + critic + logits + activations + kv_cache
    figures = {
        "model": (
            f"{config.model.name} ({hf.model_type}, {layers} layers, "
            f"hidden {hidden}, vocab {vocab})"
        ),
        "parameters": f"{params / 1e6:,.1f}M ({trainable / 1e6:,.1f}M trainable)",
        "episodes per step": (
            f"{episodes} ({rc.tasks_per_step} tasks x {rc.samples_per_task} samples), "
            f"<= {rc.max_tokens} tokens per turn"
        ),
        "weights (fp32)": _gib(weights),
        "gradients + AdamW": _gib(optimizer),
        **({"critic (weights, gradients, AdamW)": _gib(critic)} if critic else {}),
        "activations per micro-batch": (
            f"{_gib(logits + activations)} ({tokens} tokens; logits {_gib(logits)})"
        ),
        "generation KV cache": _gib(kv_cache),
        "total (rough)": _gib(total),
    }
    if config.backend.kind == "megatron":
        figures["per Megatron rank"] = _per_rank(config, weights + optimizer, logits + activations)
    return figures


def _per_rank(config: TrainConfig, state: float, activations: float) -> str:
    """Weights and optimizer state split over tp x pp; activations over tp (a stage holds its
    layers' share; the last one holds the logits, so this is rough)."""
    m = config.backend.megatron
    split = m.tensor_parallel * m.pipeline_parallel
    return (
        f"{_gib(state / split + activations / m.tensor_parallel)} "
        f"(tp={m.tensor_parallel}, pp={m.pipeline_parallel}; vLLM apart)"
    )


def _trainable(params: int, hf: Any, config: TrainConfig) -> int:
    lora = config.model.lora
    if lora is None:
        return params
    # all-linear LoRA: r x (in + out) per projection; ~7 projections per layer in Llama-style blocks
    inter = getattr(hf, "intermediate_size", 4 * hf.hidden_size)
    per_layer = lora.rank * (4 * 2 * hf.hidden_size + 3 * (hf.hidden_size + inter))
    return per_layer * hf.num_hidden_layers


def _gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"
