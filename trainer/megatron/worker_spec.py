"""What a Megatron rank is built from: :class:`WorkerSpec`, plain values that travel to the
rank's Ray actor (or torchrun process)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerSpec:
    """What a rank needs to build its shard (plain values: it travels to Ray actors)."""

    model_path: str
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    dtype: str = "float32"
    seed: int = 0
    temperature: float = 1.0
    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    grad_clip: float | None = 1.0
    schedule: str = "constant"
    warmup_steps: int = 0
    total_updates: int = 1
    sft_updates: int = 0
    """Supervised updates before the schedule starts (a warm start's), at ``sft_lr_scale``."""
    sft_lr_scale: float = 1.0
    entropy_coef: float = 0.0
    reference: bool = False
    recompute: bool = False
    """Recompute each transformer layer's activations in the backward pass (megatron-core's
    full, uniform recomputation, one layer per unit): activation memory for one layer's inputs
    per layer, at the cost of a second forward."""
    distributed_optimizer: bool | None = None
    """Shard the optimizer state and the fp32 master weights across the data-parallel ranks
    (megatron-core's distributed optimizer); ``None``: on GPUs (it takes CUDA tensors only)."""
    compile_logprobs: bool = False
    """The logprobs and entropy metric through ``fused_logprobs`` (one tensor rank only: under
    tensor parallelism the collective path runs)."""
    compile_layers: bool = False
    """Each transformer layer ``torch.compile``d (one compiled block for all) and packed rows
    padded to a bucket's length."""
