"""How episodes are generated (``rollout:``), and the vLLM engine (``rollout.vllm:``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from envhub.defaults import EPISODE_TIMEOUT_S, STEP_TIMEOUT_S
from envhub.trainer.config_base import ConfigPart as _Part


class VLLMConfig(_Part):
    """The vLLM rollout engine (``rollout.engine: vllm``) and how it gets the trainer's weights."""

    mode: Literal["server", "inprocess", "ray"] = "server"
    """``server``: a ``vllm serve`` process the trainer starts (or ``url``) and talks to over
    HTTP. ``inprocess``: vLLM's ``AsyncLLM`` inside the trainer process (colocated). ``ray``: a
    ``vllm serve`` process that a Ray actor starts in a placement-group bundle of the cluster
    (``cluster.address``, or a local one), split from or colocated with the trainer ranks."""
    colocate: bool = False
    """``ray`` mode: put the engine in the first trainer rank's bundle (its node and GPU, shared;
    needs ``backend.kind: megatron``) instead of a bundle of its own."""
    engines: int = Field(1, ge=1)
    """``ray`` mode: vLLM engines serving the policy side by side (each in a bundle of its own,
    all synced together); requests go to the least busy one."""
    tensor_parallel: int = Field(1, ge=1)
    """GPUs of one engine (vLLM's tensor parallelism). In ``ray`` mode, a split engine's bundle
    reserves them, and the trainer ranks get the node's other GPUs by default."""
    url: str | None = None
    """An already running vLLM server to use instead of starting one (``server`` mode). It must
    run with ``VLLM_SERVER_DEV_MODE=1`` and the flags ``envhub.trainer.engines.vllm.serve_args``
    lists (weight transfer, logprobs mode, dtype); the trainer checks and says what is missing."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Engine dtype; ``auto`` is the trainer's: float32 on the CPU (logprobs match to ~1e-6), or
    ``model.dtype`` when that is 16-bit (autocast), and bfloat16 on GPUs."""
    max_model_len: int | None = None
    """Context to allocate for (default: 4096, or the model's limit when smaller)."""
    gpu_memory_utilization: float = Field(0.4, gt=0.0, le=1.0)
    """Share of GPU memory vLLM may take (weights + KV cache); the trainer needs the rest when
    they share a GPU."""
    kv_cache_gb: float = Field(2.0, gt=0.0)
    """KV cache on the CPU (``VLLM_CPU_KVCACHE_SPACE``)."""
    cpu_cores: Annotated[int, Field(ge=0)] | Literal["auto"] | None = None
    """Cores vLLM's CPU engine binds its compute threads to (the machine's last ones), when it
    shares the machine's cores with the torch trainer; torch updates with the rest while
    episodes roll out (``backend.threads`` overrides). ``auto``: chosen from the machine and the
    measured phases for asynchronous runs (``max_staleness >= 1``: see ``trainer/cores.py``).
    Default (``None``): ``auto`` for asynchronous runs (measured to win: docs/guides/async.md),
    no split for synchronous ones. 0: no split, both sides on every core. Ignored on GPUs, by
    Ray-placed engines and by an external server (``url``)."""
    sleep: Literal["auto", "on", "off"] = "auto"
    """Put vLLM to sleep (weights offloaded, KV cache freed) while the trainer updates, and
    wake it for rollouts. ``auto``: on for ``inprocess`` runs on a GPU. CPU builds ignore it."""
    weight_transfer: str = "auto"
    """vLLM weight-transfer backend (a module of ``trainer/weight_sync/transfers``):
    ``envhub_shm``, ``nccl`` or ``ipc``. ``auto``: ``envhub_shm`` (shared memory) on the CPU,
    ``ipc`` for ``inprocess`` on a GPU, ``nccl`` for a GPU server."""
    bucket_mb: int = Field(256, ge=1)
    """Weights are sent in buckets of about this size (whole layers)."""
    lora_sync: Literal["auto", "adapter", "merged"] = "auto"
    """How a LoRA run (``model.lora``) sends the policy. ``adapter``: vLLM serves the base model
    with the policy's adapter, reloaded after each step (megabytes per sync instead of the whole
    model; ``server`` mode, engines on the trainer's host). ``merged``: every weight, LoRA
    merged, as a full run. ``auto``: adapter on GPUs in server mode, else merged (vLLM's CPU
    LoRA layers made generation 2.25x slower than the merged model, measured)."""
    verify: Literal["every", "first", "off"] = "every"
    """After a sync, compare vLLM's logprobs of a fixed sequence with the trainer's:
    after every sync, only the first one (at start or resume), or never."""
    verify_tolerance: float | None = Field(None, gt=0.0)
    """Largest allowed |vLLM - trainer| logprob difference on that sequence: its largest for a
    float32 engine (default 1e-3), its mean for a 16-bit one (default 0.2; rounding alone gives
    means of ~0.05 and moves single unlikely tokens by up to ~0.6)."""
    verify_tokens: int = Field(64, ge=2)
    enforce_eager: bool | None = None
    """Skip vLLM's graph compilation. Default: eager on the CPU (SmolLM2-135M on 2 cores starts in
    44 s instead of 139 s and generates 13% slower, a win for runs under ~100 steps), compiled
    (torch.compile, CUDA graphs) on GPUs."""
    startup_timeout: float = Field(900.0, gt=0.0)
    extra_args: list[str] = Field(default_factory=list)
    """More ``vllm serve`` arguments (``server`` mode)."""

    @field_validator("weight_transfer")
    @classmethod
    def _known_transfer(cls, value: str) -> str:
        from envhub.trainer.weight_sync import transfers  # light: names only, no torch or vLLM

        if value != transfers.AUTO:
            transfers.get(value)  # raises with the known names
        return value


class RolloutConfig(_Part):
    """How episodes are generated each step."""

    engine: Literal["hf", "vllm"] = "hf"
    """``hf``: generate in-process with the policy model itself (transformers ``generate``).
    ``vllm``: generate with vLLM, which receives the new weights after every step."""
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)
    tasks_per_step: int = Field(8, ge=1)
    samples_per_task: int = Field(8, ge=1)
    """GRPO group size: episodes per task, compared with each other."""
    max_tokens: int = Field(256, ge=1)
    """Tokens per assistant turn (an env's own budget can lower it)."""
    temperature: float = Field(1.0, gt=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Must stay 1 for training: see ``top_k``."""
    top_k: int | None = None
    """Must stay unset for training: a truncated sampler (top-p < 1, top-k) samples from, and
    reports logprobs of, another distribution than the policy the trainer scores, which biases
    every importance ratio. ``envhub eval`` takes both."""
    max_staleness: int = Field(0, ge=0)
    """Asynchronous training: how many policy versions behind the policy being updated a
    group's oldest token may be. 0 is synchronous (roll out, update, sync, repeat). With k >= 1
    vLLM keeps sampling the next steps' groups while the trainer updates, with the newest
    weights it has (a sync lands without draining it); a group older than k versions is dropped
    (counted as ``async/stale_groups``) and its task sampled again. Needs ``engine: vllm``."""
    max_concurrency: int = Field(64, ge=1)
    """Episodes in flight at once (also the largest generation batch)."""
    step_timeout: float | None = STEP_TIMEOUT_S
    """Seconds one env step may take before its episode fails."""
    episode_timeout: float | None = EPISODE_TIMEOUT_S
    """Seconds an episode may take."""
    workers: int = Field(0, ge=0)
    """Ray actors (one CPU each) that run the episodes, so that env code, rewards and sandboxes
    never share a process with the trainer; each step's groups are dealt to them and
    ``max_concurrency`` is split between them. 0 runs episodes in the trainer's process. Needs
    ``engine: vllm`` with a server (``vllm.mode``: ``server`` or ``ray``), which the actors reach
    over HTTP; a Ray cluster (``cluster.address``, or a local one) is started for them."""
