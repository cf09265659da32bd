"""Where and how the update runs: the optimizer (``optimizer:``), the train backend
(``backend:``, with Megatron's parallel layout) and the Ray cluster of its ranks
(``cluster:``)."""

from __future__ import annotations

from typing import Annotated, Literal

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


Switch = bool | Literal["auto"]
"""A speed-up's setting: ``true``, ``false``, or ``auto`` (on CUDA where :data:`PAYS_ON_CUDA`
says the GPU checks measured it to pay; off on the CPU)."""

PAYS_ON_CUDA = {"compile.logprobs": False, "compile.layers": False, "packing": False}
"""What ``auto`` turns on on CUDA: what ``bench/gpu_checks.sh`` measured faster there (the
stages ``lpc``, ``tu05c``/``mg05c`` for compilation, ``tu05`` for packing). Off until a GPU
measures it: on an H200 (2026-11-28) the torch backend's packed update gave 9.2% MFU, its padded
one 10.6%; compilation has not run on a GPU yet. Flip an entry with the numbers in the commit."""


def resolve_switch(choice: Switch, name: str, on_cuda: bool) -> bool:
    """Whether the speed-up ``name`` (a key of :data:`PAYS_ON_CUDA`) runs: ``true``/``false``
    as set; ``auto`` where it pays on CUDA, never on the CPU."""
    if choice != "auto":
        return bool(choice)
    return on_cuda and PAYS_ON_CUDA[name]


class CompileConfig(_Part):
    """``torch.compile`` of the update's hot paths: kernels from torch itself (Triton on CUDA),
    no Transformer Engine or Apex needed."""

    logprobs: Switch = "auto"
    """The trained tokens' log-softmax-gather and entropy, one fused kernel per chunk
    (``backends/fused_logprobs.py``; one tensor rank: under tensor parallelism the eager,
    collective path runs)."""
    layers: Switch = "auto"
    """Regional compilation: each decoder layer compiled, one compiled block reused by every
    layer (fewer kernel launches per layer). Micro-batch lengths are then padded to buckets
    (at most 1/8 more tokens) so the compiled code meets few shapes; the compile time is
    logged."""


class BackendConfig(_Part):
    """Where and how the train step runs."""

    kind: Literal["torch", "megatron"] = "torch"
    """``torch``: this process, an HF model on the CPU or one GPU. ``megatron``: megatron-core
    ranks on Ray (tensor, pipeline and data parallel), with ``rollout.engine: vllm``."""
    megatron: MegatronConfig = Field(default_factory=MegatronConfig)
    device: str = "auto"
    """``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda``, ``cuda:1``..."""
    micro_batch_tokens: Annotated[int, Field(ge=16)] | Literal["auto"] = "auto"
    """Tokens per micro-batch (gradient accumulation bins sequences up to this): real tokens
    where a bin is packed into one row without padding (the Megatron backend; the torch backend
    with ``packing: packed``), padded tokens where it is right-padded. ``auto``: on a GPU the
    largest power of two up to 16384 whose activations fit beside the weights and optimizer
    state in its memory (``estimate.largest_micro_batch``: 16384 for a 0.5B model on 80 GB);
    4096 on the CPU."""
    compile: CompileConfig = Field(default_factory=CompileConfig)
    packing: Literal["auto", "packed", "padded"] = "auto"
    """The torch backend's micro-batches: ``packed`` lays each one's sequences end to end in one
    row (no padding; each sequence attends to itself; sequences with the same prompt run it
    once, see ``backends/packed_attention.py``), ``padded`` right-pads them into a
    ``[n, longest]`` batch. ``auto``: packed for the plain-attention model types (Llama,
    Mistral, Qwen2/3, Phi-3, OLMo 2) on the CPU, and on CUDA when torch's one-call varlen
    attention runs there and :data:`PAYS_ON_CUDA` says packed measured at least as fast as
    padded (not yet: 9.2% against 10.6% MFU on an H200); else padded."""
    threads: int | None = None
    """CPU threads for torch (default: torch's choice)."""
