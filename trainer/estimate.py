"""A size and memory estimate of a run, from the model's config alone (no weights loaded).

Rough by design: it tells a 135M CPU run from a 7B run that will not fit, before anything
starts. Training memory = parameters (fp32 master copy) + gradients + AdamW's two moments for
trainable parameters, + a reference model when the KL penalty is on, + a critic (another copy
of the weights, its gradients and AdamW moments, no vocabulary logits) with ``advantage: gae``,
+ activations of one micro-batch (:class:`Activations`), + the generation KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
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
    weights = params * 4 * (2 if config.algorithm.needs_reference else 1)
    optimizer = trainable * (4 + 8)
    act = Activations.of(config, hf, tokens=_dry_run_tokens(config, hf, params))
    kv_heads = getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads
    head_dim = getattr(hf, "head_dim", None) or hidden // hf.num_attention_heads
    context = 1024 + rc.max_tokens
    kv_cache = min(rc.max_concurrency, episodes) * context * 2 * layers * kv_heads * head_dim * 4
    critic = params * (4 + 4 + 8) if config.algorithm.needs_critic else 0
    total = weights + optimizer + critic + act.total + kv_cache
    figures = {
        "model": (
            f"{config.model.name} ({hf.model_type}, {layers} layers, "
            f"hidden {hidden}, vocab {vocab})"
        ),
        "parameters": f"{params / 1e6:,.1f}M ({trainable / 1e6:,.1f}M trainable)",
        **({"stages": stages(config)} if config.sft is not None else {}),
        "episodes per step": (
            f"{episodes} ({rc.tasks_per_step} tasks x {rc.samples_per_task} samples), "
            f"<= {rc.max_tokens} tokens per turn"
        ),
        "weights (fp32)": _gib(weights),
        "gradients + AdamW": _gib(optimizer),
        **({"critic (weights, gradients, AdamW)": _gib(critic)} if critic else {}),
        "activations per micro-batch": act.describe(),
        "  assumes": act.assumptions(),
        "  to lower it": act.knobs(),
        "generation KV cache": _gib(kv_cache),
        "total (rough)": _gib(total),
    }
    if config.backend.kind == "megatron":
        figures["per Megatron rank"] = _per_rank(config, weights + optimizer, act.total)
    return figures


LOGIT_COPIES = 3
"""Vocabulary-sized float32 tensors per token alive at the loss's peak: the logits, the
log-softmax's (or entropy's) intermediate, and their gradient."""


@dataclass(frozen=True)
class Activations:
    """What one micro-batch's forward keeps for the backward, in bytes, and what that assumes.

    Per token and layer a Llama-style block keeps about ``8 x hidden`` values (the norms' inputs
    and outputs, q/k/v, rotary q/k, the attention output; SDPA or flash attention keeps no
    score matrix) and ``4 x intermediate`` for its gated MLP (gate, up, their activation and
    product). With recomputation (``model.gradient_checkpointing``) only each layer's input
    stays, and one layer's full set is rebuilt at a time. The logits are float32 at every token
    (:data:`LOGIT_COPIES` copies); the torch backend computes them only at the policy's tokens
    for a plain LM head, so that part is an upper bound.
    """

    tokens: int
    layers: int
    hidden: int
    intermediate: int
    vocab: int
    dtype: str
    recompute: bool

    @classmethod
    def of(cls, config: TrainConfig, hf: Any, tokens: int | None = None) -> Activations:
        """The micro-batch of ``config`` (``tokens`` of them: its ``backend.micro_batch_tokens``
        by default, :data:`CPU_TOKENS` for ``auto``) on the model that ``hf`` (its HF config)
        describes."""
        hidden = hf.hidden_size
        if tokens is None:
            budget = config.backend.micro_batch_tokens
            tokens = CPU_TOKENS if budget == "auto" else budget
        return cls(
            tokens=tokens, layers=hf.num_hidden_layers, hidden=hidden,
            intermediate=getattr(hf, "intermediate_size", None) or 4 * hidden,
            vocab=hf.vocab_size, dtype=activation_dtype(config),
            recompute=config.model.gradient_checkpointing,
        )  # fmt: skip

    @property
    def values_per_token_layer(self) -> int:
        """Values one token keeps in one layer without recomputation."""
        return 8 * self.hidden + 4 * self.intermediate

    @property
    def layer_bytes(self) -> int:
        """The layers' share: every layer's values, or with recomputation the layers' inputs
        and one layer's values."""
        size = DTYPE_BYTES[self.dtype] * self.tokens
        if self.recompute:
            return size * (self.layers * self.hidden + self.values_per_token_layer)
        return size * self.layers * self.values_per_token_layer

    @property
    def logit_bytes(self) -> int:
        """The logits' share: :data:`LOGIT_COPIES` float32 vocabulary rows per token."""
        return self.tokens * self.vocab * 4 * LOGIT_COPIES

    @property
    def total(self) -> int:
        """Layers and logits."""
        return self.layer_bytes + self.logit_bytes

    def describe(self) -> str:
        """``"7.17 GiB (layers 4.92 GiB, logits 2.25 GiB)"``."""
        return (
            f"{_gib(self.total)} (layers {_gib(self.layer_bytes)}, logits {_gib(self.logit_bytes)})"
        )

    def assumptions(self) -> str:
        """What the figure assumes, each with the config key that sets it."""
        recompute = "on" if self.recompute else "off"
        return (
            f"{self.tokens} tokens per micro-batch (backend.micro_batch_tokens), {self.dtype} "
            f"activations (model.dtype), recomputation {recompute} "
            f"(model.gradient_checkpointing), {8 + 4 * self.intermediate / self.hidden:.1f} "
            f"x hidden values per token and layer, float32 logits at every token "
            f"({LOGIT_COPIES} copies)"
        )

    def knobs(self) -> str:
        """The settings that lower the figure, with what it becomes."""
        quarter = replace(self, tokens=max(self.tokens // 4, 16))
        knobs = [f"backend.micro_batch_tokens={quarter.tokens}: {_gib(quarter.total)}"]
        if not self.recompute:
            knobs.append(
                f"model.gradient_checkpointing=true: {_gib(replace(self, recompute=True).total)}"
            )
        return "; ".join(knobs)


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

CPU_TOKENS = 4096
"""``backend.micro_batch_tokens: auto`` on the CPU."""
AUTO_TOKENS = (1024, 16384)
"""The powers of two ``auto`` picks from on a GPU. 16384 is the largest measured: a 0.5B
Megatron update ran at 17.5% MFU there against 9.8% at 4096 (H200, 2026-11-28)."""
MEMORY_SHARE = 0.85
"""The share of a GPU's memory the estimate fills: the CUDA context, the allocator's
fragmentation and what the estimate leaves out (kernels' workspaces) take the rest."""


def training_state_bytes(config: TrainConfig, params: int, trainable: int) -> int:
    """Weights (a float32 master copy, a bf16 copy for the forward; a reference model's and a
    critic's), gradients and AdamW's moments, on one device (split over ``tp x pp`` ranks for
    Megatron). Rough: Megatron's bf16 weights, float32 gradients and master copy come to the
    same 18 bytes per parameter."""
    per_param = 4 + 2 + (6 if config.algorithm.needs_reference else 0)
    state = params * per_param + trainable * (4 + 8)
    if config.algorithm.needs_critic:
        state += params * (4 + 4 + 8)
    m = config.backend.megatron
    split = m.tensor_parallel * m.pipeline_parallel if config.backend.kind == "megatron" else 1
    return state // split


def largest_micro_batch(activations: Activations, state_bytes: int, device_bytes: int) -> int:
    """The largest power of two of :data:`AUTO_TOKENS` whose micro-batch (``activations`` at
    that many tokens) fits beside ``state_bytes`` in :data:`MEMORY_SHARE` of ``device_bytes``;
    the smallest when none does (the run may then fail for memory: lower the model's size or
    turn on ``model.gradient_checkpointing``, which the activations take as they are)."""
    low, high = AUTO_TOKENS
    room = MEMORY_SHARE * device_bytes - state_bytes
    tokens = high
    while tokens > low and replace(activations, tokens=tokens).total > room:
        tokens //= 2
    return tokens


def micro_batch_tokens(config: TrainConfig, device_bytes: int | None) -> int:
    """``backend.micro_batch_tokens`` as the backends use it: the number set, or for ``auto``
    :func:`largest_micro_batch` on a GPU of ``device_bytes`` (:data:`CPU_TOKENS` without one:
    ``None``)."""
    budget = config.backend.micro_batch_tokens
    if budget != "auto":
        return budget
    if device_bytes is None:
        return CPU_TOKENS
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(resolve_model(config.model.name))
    return _auto_tokens(config, hf, count_parameters(hf), device_bytes)


def _auto_tokens(config: TrainConfig, hf: Any, params: int, device_bytes: int) -> int:
    # A Megatron rank holds a share of the activations (tp, pp): counting them whole errs
    # towards smaller micro-batches.
    state = training_state_bytes(config, params, _trainable(params, hf, config))
    activations = Activations.of(config, hf, tokens=CPU_TOKENS)
    return largest_micro_batch(activations, state, device_bytes)


def device_memory(device: torch.device) -> int | None:
    """``device``'s memory in bytes; ``None`` for the CPU."""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).total_memory


def _dry_run_tokens(config: TrainConfig, hf: Any, params: int) -> int:
    """The micro-batch the run would take: ``auto`` resolved for this machine's first GPU
    when the run trains on a GPU."""
    budget = config.backend.micro_batch_tokens
    if budget != "auto":
        return budget
    on_gpu = config.backend.kind == "megatron" or config.backend.device != "cpu"
    if not (on_gpu and torch.cuda.is_available()):
        return CPU_TOKENS
    return _auto_tokens(config, hf, params, device_memory(torch.device("cuda", 0)) or 0)


def activation_dtype(config: TrainConfig) -> str:
    """The dtype activations are held in: ``model.dtype``, whose ``auto`` is bfloat16 on a GPU
    (Megatron always runs on GPUs) and float32 on the CPU, as the backends resolve it."""
    if config.model.dtype != "auto":
        return config.model.dtype
    device = config.backend.device
    on_gpu = (
        config.backend.kind == "megatron"
        or device.startswith("cuda")
        or (device == "auto" and torch.cuda.is_available())
    )
    return "bfloat16" if on_gpu else "float32"


def stages(config: TrainConfig) -> str:
    """What the run does in order: its supervised steps on which demonstrations, then RL."""
    sft = config.sft
    assert sft is not None
    if sft.steps is None:
        length = f"{sft.epochs:g} epochs of supervised steps (counted once the demonstrations load)"
    else:
        length = f"{sft.steps} supervised steps"
    sources = "; ".join(source.describe() for source in sft.sources)
    lr = sft.lr if sft.lr is not None else config.optimizer.lr
    text = (
        f"{length} ({sft.batch_size} demonstrations each, lr {lr:g}; from {sources}), "
        f"then {config.steps} RL steps"
    )
    if sft.aux_weight:
        size = sft.aux_batch_size or sft.batch_size
        text += f" with {size} demonstrations weighted {sft.aux_weight:g} in each update"
    return text


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
