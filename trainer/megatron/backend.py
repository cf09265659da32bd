"""The Megatron backend's driver: a :class:`TrainBackend` whose ranks are Ray actors.

The training loop talks to it exactly as to the torch backend. Each call is broadcast to every
rank (:class:`MegatronWorker`) and the answer is taken from the ranks that hold it: logprobs from
the last pipeline stage of each data-parallel replica, metrics and weights from one rank.
Rollouts never run in the ranks: environments and sandboxes run in the driver's process (and
its sandbox processes), or with ``rollout.workers`` in Ray CPU actors (``rollout_workers``);
vLLM runs in its own process, which with ``rollout.vllm.mode: ray`` Ray places in a bundle of
its own or in the first rank's (``engines.vllm_ray``). Weights go from the ranks to vLLM
directly (:meth:`MegatronBackend.weight_sender`: rank 0 sends, every rank gathers), relayed
through the driver only where rank 0 cannot reach the engines.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from envhub.errors import CheckpointError, ConfigError
from envhub.trainer.algorithms import ObjectiveSpec
from envhub.trainer.backends.base import StepResult
from envhub.trainer.batch import Batch, MicroBatch, micro_batches
from envhub.trainer.cluster.placement import Placement, WorkerGroup
from envhub.trainer.cluster.ray_runtime import node_ip
from envhub.trainer.config import TrainConfig
from envhub.trainer.config.backend import resolve_switch
from envhub.trainer.engines.vllm_ray import COLOCATED_GPU_SHARE
from envhub.trainer.estimate import device_memory, micro_batch_tokens
from envhub.trainer.megatron.rank_setup import SETUP_ENV
from envhub.trainer.megatron.worker import MegatronWorker, WorkerSpec
from envhub.trainer.megatron.worker_io import WORKER_STATE
from envhub.trainer.megatron.worker_steps import BatchLoss
from envhub.trainer.models import resolve_model

if TYPE_CHECKING:
    from envhub.trainer.weight_sync import TransferPlan, WeightSender

log = logging.getLogger(__name__)

WEIGHT_BUCKET_BYTES = 256 << 20
"""How much of the model the driver holds at once while it hands weights to the engine."""


class MegatronBackend:
    """Trains with megatron-core ranks placed on Ray (see the module docstring)."""

    autocast_dtype = None
    """The ranks compute in the model's own dtype (bf16 parameters on GPUs): no autocast."""

    def __init__(self, config: TrainConfig) -> None:
        from transformers import AutoTokenizer

        self.config = config
        self.model_path = resolve_model(config.model.name)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.placement, self.layout = plan(config)
        check_layout(self.model_path, *self.layout[:2])
        self.group = WorkerGroup(
            MegatronWorker,
            self.placement,
            env=_worker_env(config),
            args=(worker_spec(config, self.model_path, self.placement),),
            name="envhub-megatron",
        )
        self._num_parameters: int | None = None
        self.micro_batch_tokens = rank_budget(config, self.placement)
        """``backend.micro_batch_tokens``, ``auto`` resolved for the ranks' GPUs."""
        log.info("micro-batches of <= %d tokens", self.micro_batch_tokens)

    @property
    def model(self) -> torch.nn.Module:
        """Not available: the model is sharded over the Ray workers, so the in-process ``hf``
        engine cannot generate with it.

        Raises:
            ConfigError: Always; use ``rollout.engine=vllm``.
        """
        raise ConfigError(
            "the Megatron backend's model lives in its Ray workers; use rollout.engine=vllm"
        )

    @property
    def device(self) -> torch.device:
        """``cuda`` when the ranks train on GPUs, else ``cpu`` (the ranks' kind of device; the
        tensors themselves live in the workers)."""
        return torch.device("cuda" if self.placement.gpus_per_node else "cpu")

    def describe(self) -> str:
        """The parallel layout and hardware, e.g. ``megatron tp=2 pp=1 dp=4 (8 GPUs x 1 nodes)``."""
        tp, pp, dp = self.layout
        where = (
            f"{self.placement.gpus_per_node} GPUs x {self.placement.nodes} nodes"
            if self.placement.gpus_per_node
            else "CPU ranks"
        )
        return f"megatron tp={tp} pp={pp} dp={dp} ({where})"

    def num_parameters(self, trainable_only: bool = False) -> int:
        """The whole model's parameter count, summed over shards by the ranks and cached.

        ``trainable_only`` changes nothing: this backend trains every weight (no LoRA).
        """
        if self._num_parameters is None:
            self._num_parameters = int(self.group.call("num_parameters")[0])
        return self._num_parameters

    @property
    def pad_id(self) -> int:
        """The tokenizer's pad id (its end-of-sequence id when it has none)."""
        pad = self.tokenizer.pad_token_id
        return pad if pad is not None else self.tokenizer.eos_token_id

    def micro_batches(self, batch: Batch) -> list[MicroBatch]:
        """Micro-batches of at most ``backend.micro_batch_tokens`` real tokens: the ranks run
        each one packed into a single row without padding (``batch.Packing``)."""
        return micro_batches(batch, self.micro_batch_tokens, self.pad_id, packed=True)

    def logprobs(
        self, batches: list[MicroBatch], reference: bool = False, temperature: float | None = None
    ) -> list[torch.Tensor]:
        """Per-target-token logprobs of each micro-batch, without gradients.

        Every rank takes part; each data-parallel replica's output rank returns its share of the
        micro-batches keyed by index, and the shares are merged back into ``batches``' order.
        """
        merged: dict[int, torch.Tensor] = {}
        for part in self.group.call("logprobs", batches, reference, temperature):
            merged |= part or {}
        return [merged[k] for k in range(len(batches))]

    def update(
        self,
        batches: list[MicroBatch],
        spec: ObjectiveSpec,
        *,
        old_logprobs: list[torch.Tensor] | None,
        ref_logprobs: list[torch.Tensor] | None,
        num_tokens: int,
        num_sequences: int,
    ) -> StepResult:
        """One optimizer update on every rank (micro-batches dealt over the data-parallel
        ranks); the metrics come from the one rank that reports them."""
        results = self.group.call(
            "update",
            batches,
            spec,
            old_logprobs=old_logprobs,
            ref_logprobs=ref_logprobs,
            num_tokens=num_tokens,
            num_sequences=num_sequences,
        )
        return StepResult(next(r for r in results if r is not None))

    def forward_backward(
        self,
        batches: list[MicroBatch],
        targets: list[torch.Tensor],
        loss: BatchLoss | None,
        forward_only: bool = False,
    ) -> list[dict[str, Any]]:
        """Score ``batches`` at ``targets`` and, unless ``forward_only``, add ``loss``'s
        gradients in the ranks without stepping
        (:meth:`~envhub.trainer.megatron.worker_steps.SplitSteps.forward_backward`); each
        micro-batch's report, in ``batches``' order."""
        merged: dict[int, dict[str, Any]] = {}
        for part in self.group.call("forward_backward", batches, targets, loss, forward_only):
            merged |= part or {}
        return [merged[k] for k in range(len(batches))]

    def optim_step(self, adam: dict[str, float]) -> float:
        """Apply the pending gradients with ``adam``'s settings
        (:meth:`~envhub.trainer.megatron.worker_steps.SplitSteps.optim_step`); the gradient
        norm before clipping."""
        return next(n for n in self.group.call("optim_step", adam) if n is not None)

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Streamed in buckets of about ``WEIGHT_BUCKET_BYTES``: the ranks gather each tensor
        from its shards, rank 0 hands the bucket over through Ray's object store (the relay
        :meth:`weight_sender` falls back to)."""
        self.group.call("begin_weights")
        while chunk := self.group.call("next_weights", WEIGHT_BUCKET_BYTES)[0]:
            yield from chunk

    def weight_sender(self, plan: TransferPlan) -> WeightSender | None:
        """Rank 0 sends straight to the engines (the other ranks gather with it), when it can
        reach them; else ``None`` and the driver relays :meth:`weights` (logged, with why)."""
        from envhub.trainer.weight_sync.ranks import RankSender, relay_reason

        rank0 = self.group.ranks_info()[0]
        reason = relay_reason(plan, rank0["node"], node_ip())
        if reason:
            log.warning(
                "vLLM weight sync: the driver relays the weights from trainer rank 0 because %s",
                reason,
            )
            return None
        return RankSender.connect(
            self.group, plan, f"sent by trainer rank 0 on node {rank0['node']} (pid {rank0['pid']})"
        )

    def state(self) -> dict[str, Any]:
        """What a checkpoint holds: a :class:`ShardedCheckpoint` of the ranks (which saves the
        optimizer shards too, hence no ``optimizer`` or ``scheduler``) and the tokenizer."""
        return {
            "model": ShardedCheckpoint(self.group),
            "optimizer": None,
            "scheduler": None,
            "tokenizer": self.tokenizer,
        }

    def export(self, target: Path) -> Path:
        """Write the whole model as an HF folder at ``target`` (rank 0 writes it); return it."""
        return Path(next(p for p in self.group.call("export", str(target)) if p is not None))

    def close(self) -> None:
        """Shut the ranks' worker group down."""
        self.group.shutdown()


class ShardedCheckpoint:
    """What :class:`CheckpointManager` saves for this backend: each rank's model and optimizer
    shards in megatron-core's distributed format (the run folder must be on storage every
    node sees)."""

    def __init__(self, group: WorkerGroup) -> None:
        self.group = group

    def save_checkpoint(self, folder: Path) -> None:
        """Have every rank write its model and optimizer shards under ``folder``."""
        self.group.call("save_checkpoint", str(folder))

    def load_checkpoint(self, folder: Path, optimizer: bool = True) -> None:
        """Have every rank load its shards from ``folder`` (resharded for the current layout);
        without ``optimizer``, the model's only (the optimizer starts afresh).

        Raises:
            CheckpointError: ``folder`` holds no Megatron checkpoint.
        """
        if not (Path(folder) / WORKER_STATE).exists():
            raise CheckpointError(
                f"{folder} holds no Megatron checkpoint (saved with backend.kind=torch?); "
                "resume with the settings it was saved with"
            )
        self.group.call("load_checkpoint", str(folder), optimizer)


def plan(config: TrainConfig) -> tuple[Placement, tuple[int, int, int]]:
    """Ranks and their (tp, pp, dp) layout from ``backend.megatron`` and ``cluster``; with a
    critic, of each of the two groups (policy, critic), which share the GPUs half and half."""
    m, cluster, engine = config.backend.megatron, config.cluster, config.rollout.vllm
    gpus = (
        cluster.gpus_per_node if cluster.gpus_per_node is not None else _trainer_gpus_here(config)
    )
    if config.algorithm.needs_critic and gpus:  # the critic's ranks take the other half
        if gpus % 2:
            raise ConfigError(
                f"a critic (algorithm.advantage=gae) takes half of the trainer's GPUs on each "
                f"node, beside the policy's: {gpus} per node do not halve"
            )
        gpus //= 2
    model_parallel = m.tensor_parallel * m.pipeline_parallel
    if gpus == 0:
        if not os.environ.get(SETUP_ENV):
            raise ConfigError(
                "backend.kind=megatron needs CUDA GPUs "
                "(none found here; for a Ray cluster set cluster.gpus_per_node); "
                "on a CPU use backend.kind=torch"
            )
        dp = m.data_parallel or 1
        return Placement(
            world_size=model_parallel * dp, nodes=cluster.nodes, address=cluster.address
        ), (m.tensor_parallel, m.pipeline_parallel, dp)
    total = gpus * cluster.nodes
    if total % model_parallel:
        raise ConfigError(
            f"{total} GPUs cannot hold tensor_parallel x pipeline_parallel = "
            f"{model_parallel} ranks evenly"
        )
    dp = m.data_parallel or total // model_parallel
    if dp * model_parallel != total:
        raise ConfigError(
            f"tp x pp x dp = {dp * model_parallel} but the cluster has {total} GPUs "
            f"({cluster.nodes} x {gpus}); fix backend.megatron.data_parallel"
        )
    share = 1.0 - COLOCATED_GPU_SHARE if engine.mode == "ray" and engine.colocate else 1.0
    return Placement(
        world_size=total,
        nodes=cluster.nodes,
        gpus_per_node=gpus,
        address=cluster.address,
        gpu_share=share,
    ), (m.tensor_parallel, m.pipeline_parallel, dp)


def _trainer_gpus_here(config: TrainConfig) -> int:
    """The GPUs torch sees, less those a split vLLM engine on Ray reserves for itself."""
    engine = config.rollout.vllm
    split_engine = (
        engine.engines * engine.tensor_parallel
        if engine.mode == "ray" and not engine.colocate
        else 0
    )
    gpus = torch.cuda.device_count()
    if not gpus:
        return 0
    if gpus <= split_engine:
        raise ConfigError(
            f"the vLLM engines' own bundles take {split_engine} of this node's {gpus} GPUs, "
            "leaving none for the trainer: "
            "set rollout.vllm.colocate=true (or lower rollout.vllm.engines / tensor_parallel)"
        )
    return gpus - split_engine


def check_layout(model_path: str, tp: int, pp: int) -> None:
    """Refuse, before any rank starts, a split that does not divide the model."""
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(model_path)
    heads, kv_heads, layers = (
        hf.num_attention_heads,
        getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads,
        hf.num_hidden_layers,
    )
    if heads % tp or (
        kv_heads % tp and tp % kv_heads
    ):  # fewer key/value heads than ranks: replicated
        raise ConfigError(
            f"backend.megatron.tensor_parallel={tp} must divide the model's {heads} attention "
            f"and {kv_heads} key/value heads"
        )
    if layers % pp:
        raise ConfigError(
            f"backend.megatron.pipeline_parallel={pp} must divide the model's {layers} layers"
        )


def rank_budget(config: TrainConfig, placement: Placement) -> int:
    """``backend.micro_batch_tokens`` for ranks of ``placement``: ``auto`` sized for a GPU like
    this process's first (a driver that sees none, on another machine than its GPU ranks,
    takes the CPU's 4096: set the number there)."""
    on_gpu = bool(placement.gpus_per_node) and torch.cuda.is_available()
    return micro_batch_tokens(config, device_memory(torch.device("cuda", 0)) if on_gpu else None)


def worker_spec(config: TrainConfig, model_path: str, placement: Placement) -> WorkerSpec:
    """What every rank needs to build its shard and optimizer, from ``config``.

    ``model.dtype: auto`` becomes bfloat16 on GPU ranks and float32 on CPU ranks; the LR
    schedule's length is ``steps x algorithm.updates_per_step`` updates, after the warm
    start's supervised ones (``sft``).
    """
    opt, compile = config.optimizer, config.backend.compile
    on_gpus = bool(placement.gpus_per_node)
    dtype = config.model.dtype
    if dtype == "auto":
        dtype = "bfloat16" if placement.gpus_per_node else "float32"
    return WorkerSpec(
        model_path=model_path,
        tensor_parallel=config.backend.megatron.tensor_parallel,
        pipeline_parallel=config.backend.megatron.pipeline_parallel,
        dtype=dtype,
        seed=config.seed,
        temperature=config.rollout.temperature,
        lr=opt.lr,
        betas=opt.betas,
        weight_decay=opt.weight_decay,
        grad_clip=opt.grad_clip,
        schedule=opt.schedule,
        warmup_steps=opt.warmup_steps,
        total_updates=config.steps * config.algorithm.updates_per_step,
        sft_updates=config.sft_steps,
        sft_lr_scale=config.sft_lr_scale,
        entropy_coef=config.algorithm.entropy_coef,
        reference=config.algorithm.needs_reference,
        recompute=config.model.gradient_checkpointing,
        compile_logprobs=resolve_switch(compile.logprobs, "compile.logprobs", on_gpus),
        compile_layers=resolve_switch(compile.layers, "compile.layers", on_gpus),
    )


def _worker_env(config: TrainConfig) -> dict[str, str]:
    """``ENVHUB_*`` variables (``ENVHUB_MEGATRON_WORKER_SETUP`` and what tests give it) reach
    the ranks even on a cluster started elsewhere; so do the backend's thread settings."""
    env = {k: v for k, v in os.environ.items() if k.startswith("ENVHUB_")}
    if config.backend.threads:
        env["OMP_NUM_THREADS"] = str(config.backend.threads)
    return env
