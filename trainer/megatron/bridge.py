"""HF <-> Megatron-core models through ``mbridge`` (verl's maintained bridge).

``mbridge`` builds a megatron-core ``GPTModel`` from an HF config (Llama, Qwen2, Qwen3, ...),
loads an HF checkpoint into it sharded for the current tensor/pipeline split and exports it
back, one HF tensor at a time. Two adaptations, both because Transformer Engine is not
installed everywhere (it is GPU-only):

- without TE the layers use megatron-core's *local* spec (torch norms and linears);
- the local spec's torch norms do not support sequence parallelism, so it is off;
- the local spec's attention takes no packed sequences: ``attention.PackedAttention`` (torch's
  SDPA per sequence) replaces it;
- the local spec names the two RMSNorms ``input_layernorm`` and ``pre_mlp_layernorm`` (TE
  fuses them into the next linear as ``layer_norm_weight``), so their HF names are added to
  the bridge's maps.

Everything here runs inside a trainer rank after ``torch.distributed`` and Megatron's
parallel state are set up.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import torch

from envhub.trainer.megatron.attention import PackedAttention

_LOCAL_SPEC_NAMES = {
    "_OTHER_MAPPING": {
        "input_layernorm.weight": ["model.layers.{layer_number}.input_layernorm.weight"]
    },
    "_MLP_MAPPING": {
        "pre_mlp_layernorm.weight": ["model.layers.{layer_number}.post_attention_layernorm.weight"]
    },
}


def have_transformer_engine() -> bool:
    """Whether Transformer Engine is installed (else the layers use the local spec)."""
    return importlib.util.find_spec("transformer_engine") is not None


def load_bridge(
    hf_path: str, dtype: torch.dtype, *, overrides: dict[str, Any] | None = None
) -> Any:
    """The ``mbridge`` bridge for the HF model at ``hf_path`` (parameters in ``dtype``), for the
    current parallel state. ``overrides`` are extra ``TransformerConfig`` fields."""
    from mbridge import AutoBridge
    from transformers import AutoConfig

    bridge = AutoBridge.from_config(
        _with_rope_theta(AutoConfig.from_pretrained(hf_path)), dtype=dtype
    )
    settings: dict[str, Any] = {
        "bias_dropout_fusion": False,
        "masked_softmax_fusion": False,
        "gradient_accumulation_fusion": False,
    }
    if getattr(bridge.hf_config, "tie_word_embeddings", False):
        # The last pipeline stage keeps its own copy of the tied embedding as its output layer.
        bridge._DIRECT_MAPPING = {
            **bridge._DIRECT_MAPPING,
            "output_layer.weight": "model.embed_tokens.weight",
        }
    if not have_transformer_engine():
        _use_local_spec(bridge)
        settings["sequence_parallel"] = False  # torch's norms cannot split the sequence
    bridge.set_extra_args(**settings, **(overrides or {}))
    return bridge


def _with_rope_theta(hf_config: Any) -> Any:
    """transformers 5 keeps ``rope_theta`` in ``rope_parameters``; mbridge reads the attribute.
    Only plain RoPE is mapped: a scaled variant would be built wrong, so it is refused."""
    rope = getattr(hf_config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        from envhub.errors import ConfigError

        raise ConfigError(
            f"the Megatron backend supports plain RoPE only; this model uses "
            f"{rope['rope_type']!r} scaling (use backend.kind=torch)"
        )
    if not hasattr(hf_config, "rope_theta") and "rope_theta" in rope:
        hf_config.rope_theta = rope["rope_theta"]
    return hf_config


def _use_local_spec(bridge: Any) -> None:
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    def local_spec(vp_stage: int | None = None) -> Any:
        bridge.has_vp_stage = True
        block = get_gpt_decoder_block_spec(
            bridge.config, use_transformer_engine=False, vp_stage=vp_stage
        )
        for layer in block.layer_specs:  # built afresh by each call: safe to change in place
            layer.submodules.self_attention.submodules.core_attention = PackedAttention
        return block

    bridge._get_transformer_layer_spec = local_spec
    for attribute, names in _LOCAL_SPEC_NAMES.items():
        setattr(bridge, attribute, {**getattr(bridge, attribute), **names})


def build_model(bridge: Any, *, vp_stage: int | None = None) -> torch.nn.Module:
    """This rank's ``GPTModel`` chunk (its pipeline stage, its tensor shard), randomly
    initialised, every parameter in the bridge's dtype."""
    from megatron.core import parallel_state as mpu

    provider = bridge._model_provider([])
    first = mpu.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage)
    last = mpu.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage)
    model = provider(pre_process=first, post_process=last, vp_stage=vp_stage)
    from megatron.core import tensor_parallel

    dtype = bridge.config.params_dtype
    for parameter in model.parameters():
        tensor_parallel.set_defaults_if_not_set_tensor_model_parallel_attributes(parameter)
        # The local spec's torch norms are made in float32 whatever the dtype (Megatron-LM casts
        # its model whole); a bf16 model with float32 norms breaks the distributed optimizer's
        # checkpoints, whose parameter order assumes one dtype.
        if parameter.is_floating_point() and parameter.dtype != dtype:
            parameter.data = parameter.data.to(dtype)
    return model


def hf_weights(bridge: Any, chunks: list[torch.nn.Module]) -> Iterator[tuple[str, torch.Tensor]]:
    """The whole model's weights under HF checkpoint names, gathered across tensor and pipeline
    ranks (every rank must iterate: the gathers are collectives). A tied embedding comes once
    (the last stage's copy of it is left out), as in an HF checkpoint of a tied model."""
    seen: set[str] = set()
    for name, tensor in bridge.export_weights(chunks):
        if name not in seen:
            seen.add(name)
            yield name, tensor
