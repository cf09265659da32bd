"""The torch backend's HF model: loaded (fp32 weights, the attention function, recomputation,
LoRA), its decoder layers, and which layout its micro-batches run in (``backend.packing``)."""

from __future__ import annotations

from typing import Any

import torch

from envhub.errors import ConfigError, MissingDependencyError
from envhub.trainer.backends import packed_attention, varlen
from envhub.trainer.config import TrainConfig
from envhub.trainer.config.backend import resolve_switch

PLAIN_HEAD = frozenset(
    {"llama", "mistral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3", "olmo2"}
)
"""HF ``model_type``s whose logits are exactly ``lm_head(final hidden state)``: no logit scaling
or soft-capping after the head (Gemma's, Cohere's and Granite's have some), so the head may run
on some positions only."""


def autocast_dtype(dtype: str, device: torch.device) -> torch.dtype | None:
    """The dtype the forward runs in under autocast: ``None`` for float32 (and ``auto`` on the
    CPU), bfloat16 for ``auto`` elsewhere, else ``model.dtype``."""
    if dtype == "float32" or (dtype == "auto" and device.type == "cpu"):
        return None
    if dtype == "auto":
        return torch.bfloat16
    return {"bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


def load_model(
    path: str, config: TrainConfig, device: torch.device, frozen: bool = False
) -> tuple[Any, torch.nn.Module]:
    """Tokenizer and fp32 model on ``device``; LoRA adapters and checkpointing as configured."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the trainer draws its own progress
    kwargs: dict[str, Any] = {"dtype": torch.float32}
    if config.model.attn_implementation:
        kwargs["attn_implementation"] = config.model.attn_implementation
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs).to(device)
    except OSError as e:
        raise ConfigError(f"cannot load model {config.model.name!r}: {e}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if takes_packed_attention(model, config, device):
        model.set_attn_implementation(packed_attention.register())
    if frozen:
        model.requires_grad_(False)
        return tokenizer, model.eval()
    if config.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False
    if config.model.lora is not None:
        model = with_lora(model, config)
    return tokenizer, model


def takes_packed_attention(
    model: torch.nn.Module, config: TrainConfig, device: torch.device
) -> bool:
    """Whether the model gets :mod:`packed_attention`'s function: where packing may run (the
    CPU, or ``packing: packed``), for the model types of :data:`PLAIN_HEAD` (their attention is
    plain causal attention; others may soft-cap or add sinks), when no attention is asked for
    and the class takes attention functions. Elsewhere (a GPU by default) the model keeps
    transformers' own choice."""
    wanted = packing_wanted(
        config.backend.packing, device, autocast_dtype(config.model.dtype, device)
    )
    plain = getattr(model.config, "model_type", None) in PLAIN_HEAD  # standard attention too
    return (
        wanted
        and plain
        and not config.model.attn_implementation
        and model._supports_attention_backend
    )


def packs(model: torch.nn.Module, config: TrainConfig, device: torch.device) -> bool:
    """Whether the policy's micro-batches run packed (``backend.packing``).

    Raises:
        ConfigError: ``packing: packed`` for a model that does not run
            :mod:`packed_attention` (its type is not one of :data:`PLAIN_HEAD`'s, its class
            takes no attention functions, or ``model.attn_implementation`` names another).
    """
    choice = config.backend.packing
    able = getattr(model.config, "_attn_implementation", None) == packed_attention.NAME
    if choice == "packed" and not able:
        raise ConfigError(
            f"backend.packing=packed: {config.model.name!r} runs attention "
            f"{getattr(model.config, '_attn_implementation', None)!r}, which cannot attend to "
            "packed sequences separately; leave model.attn_implementation unset (for a "
            f"model of type {', '.join(sorted(PLAIN_HEAD))}) or set backend.packing=padded"
        )
    return able and packing_wanted(choice, device, autocast_dtype(config.model.dtype, device))


def packing_wanted(choice: str, device: torch.device, autocast: torch.dtype | None) -> bool:
    """``backend.packing``'s rule: ``packed``; ``padded``; ``auto``: packed on the CPU, and on
    CUDA where torch's varlen attention runs (a 16-bit autocast and a torch with
    ``varlen_attn``: one kernel call per layer for the whole row) and the GPU checks measured
    packed at least as fast as padded (``PAYS_ON_CUDA["packing"]``). The model must also take
    packed attention (:func:`packs`)."""
    if choice != "auto":
        return choice == "packed"
    if device.type == "cpu":
        return True
    varlen_runs = device.type == "cuda" and autocast is not None and varlen.available()
    return varlen_runs and resolve_switch("auto", "packing", on_cuda=True)


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder layers of an HF causal LM (under a LoRA ``PeftModel`` too)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder().layers


def with_lora(model: torch.nn.Module, config: TrainConfig) -> torch.nn.Module:
    """``model`` with ``model.lora``'s adapters (``peft``)."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as e:
        raise MissingDependencyError.for_extra("peft", "train") from e
    lora = config.model.lora
    assert lora is not None
    peft_config = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, peft_config)
