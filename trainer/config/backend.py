"""Where and how the update runs: the optimizer (``optimizer:``), the train backend
(``backend:``, with Megatron's parallel layout) and the Ray cluster of its ranks
(``cluster:``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from envhub.trainer.config_base import ConfigPart as _Part


class OptimizerConfig(_Part):
    """AdamW and its schedule."""

    lr: float = Field(1e-6, gt=0.0)
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = Field(0.0, ge=0.0)
    grad_clip: float | None = Field(1.0, gt=0.0)
    warmup_steps: int = Field(0, ge=0)
    schedule: Literal["constant", "linear", "cosine"] = "constant"


class MegatronConfig(_Part):
    """The Megatron backend's parallel layout (``backend.kind: megatron``)."""

    tensor_parallel: int = Field(1, ge=1)
    """Ranks that split each layer's matrices (keep it within a node)."""
    pipeline_parallel: int = Field(1, ge=1)
    """Ranks that split the layers into consecutive stages."""
    data_parallel: int | None = Field(None, ge=1)
    """Model replicas; default: what the GPUs leave (``nodes * gpus_per_node / (tp * pp)``),
    or 1 on CPU ranks."""


class ClusterConfig(_Part):
    """Where the Megatron backend's trainer ranks run (placed on Ray)."""

    address: str | None = None
    """An existing Ray cluster (``auto``, ``ray://host:10001``); default: a local one started
    for the run (nothing to set up on one machine)."""
    nodes: int = Field(1, ge=1)
    gpus_per_node: int | None = Field(None, ge=0)
    """GPUs per node for trainer ranks; default: every GPU torch sees here. 0 runs the ranks
    on CPUs, which megatron-core supports only for tests (see ``tests/trainer/megatron``)."""


class BackendConfig(_Part):
    """Where and how the train step runs."""

    kind: Literal["torch", "megatron"] = "torch"
    """``torch``: this process, an HF model on the CPU or one GPU. ``megatron``: megatron-core
    ranks on Ray (tensor, pipeline and data parallel), with ``rollout.engine: vllm``."""
    megatron: MegatronConfig = Field(default_factory=MegatronConfig)
    device: str = "auto"
    """``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda``, ``cuda:1``..."""
    micro_batch_tokens: int = Field(4096, ge=16)
    """Tokens per micro-batch (gradient accumulation bins sequences up to this): real tokens
    where a bin is packed into one row without padding (the Megatron backend; the torch backend
    with ``packing: packed``), padded tokens where it is right-padded."""
    packing: Literal["auto", "packed", "padded"] = "auto"
    """The torch backend's micro-batches: ``packed`` lays each one's sequences end to end in one
    row (no padding; each sequence attends to itself; sequences with the same prompt run it
    once, see ``backends/packed_attention.py``), ``padded`` right-pads them into a
    ``[n, longest]`` batch. ``auto``: packed on the CPU for the plain-attention model types
    (Llama, Mistral, Qwen2/3, Phi-3, OLMo 2), else padded (on an H200 a packed update ran 7x
    slower than a padded one: its one SDPA call per segment is launch-bound on a GPU)."""
    threads: int | None = None
    """CPU threads for torch (default: torch's choice)."""
