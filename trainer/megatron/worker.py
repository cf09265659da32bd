"""One trainer rank of the Megatron backend: a megatron-core model shard and its optimizer.

Every rank runs the same calls (the driver broadcasts them through Ray). The micro-batches of
an update are dealt round-robin to the data-parallel ranks and pushed through megatron-core's
pipeline schedule, each packed into one row without padding (``batch.Packing``): varlen
attention over the sequences (Transformer Engine's, else torch's SDPA per sequence);
logprobs are unpacked to the padded layout the losses take. The loss of each micro-batch is
already normalised by the totals of the whole update (``algorithms.aggregation``), so
``calculate_per_token_loss`` keeps megatron-core from averaging it again, and data-parallel
gradients are summed, not averaged: the update is the same for any tensor/pipeline/data split
and micro-batch count.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from envhub.trainer.algorithms import ObjectiveSpec, policy_objective
from envhub.trainer.backends import compiled_layers
from envhub.trainer.backends.fused_logprobs import fused_logprobs
from envhub.trainer.backends.torch_backend import lr_multiplier
from envhub.trainer.batch import MicroBatch, Packing, to_device
from envhub.trainer.megatron.attention import packed_seq_params, segment_lengths
from envhub.trainer.megatron.bridge import (
    build_model,
    have_transformer_engine,
    hf_weights,
    load_bridge,
)
from envhub.trainer.megatron.grad_norm import use_device_grad_norm
from envhub.trainer.megatron.loss import (
    chunked_logprobs,
    vocab_parallel_entropy,
    vocab_parallel_entropy_report,
)
from envhub.trainer.megatron.torch_adam import keep_states_a_load_leaves_out, unshare_steps
from envhub.trainer.weight_sync.plan import TransferPlan

if TYPE_CHECKING:
    from envhub.trainer.weight_sync.ranks import RankTransfer

SETUP_ENV = "ENVHUB_MEGATRON_WORKER_SETUP"
"""A Python file every rank runs before building anything (the tests' CPU compatibility)."""

WORKER_STATE = "envhub_worker.json"
"""Written next to the distributed checkpoint: the update counter (and the mark of a
complete Megatron checkpoint)."""

RECOMPUTE = {
    "recompute_granularity": "full",
    "recompute_method": "uniform",
    "recompute_num_layers": 1,
}
"""megatron-core's settings for ``model.gradient_checkpointing`` (what the torch backend's HF
gradient checkpointing does: keep each layer's input, recompute the layer)."""

CHECKPOINT_METADATA = {"distrib_optim_sharding_type": "fully_reshardable"}
"""How the distributed optimizer (GPU runs) lays out its checkpoint: one tensor per parameter, so
any tensor/pipeline/data split can load it. megatron-core 0.19's default
(``fully_sharded_model_space``) fails to save ("ShardedTensor.flattened_range is not
supported"); the single-process optimizers (CPU runs) ignore it."""

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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


class MegatronWorker:
    """A rank: sets up torch.distributed and Megatron's parallel state from the environment
    (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, ``LOCAL_RANK``), then builds its
    model shard from the HF checkpoint."""

    def __init__(self, spec: WorkerSpec) -> None:
        # Without Transformer Engine/Apex megatron-core warns once per module; the fallbacks are
        # the point on machines without them (GPU runs with TE do not take them).
        warnings.filterwarnings("ignore", message=r".*(Apex|Transformer Engine).* not installed")
        _run_setup_file()
        use_device_grad_norm()
        from megatron.core import parallel_state as mpu
        from megatron.core import tensor_parallel

        self.spec = spec
        self.device = _init_distributed()
        self.distributed_optimizer = (
            self.device.type == "cuda"
            if spec.distributed_optimizer is None
            else spec.distributed_optimizer
        )
        mpu.initialize_model_parallel(spec.tensor_parallel, spec.pipeline_parallel)
        tensor_parallel.model_parallel_cuda_manual_seed(spec.seed)
        dtype = _DTYPES[spec.dtype]
        self.bridge = load_bridge(
            spec.model_path,
            dtype,
            overrides={"calculate_per_token_loss": True, **(RECOMPUTE if spec.recompute else {})},
        )
        policy = self._load(spec.model_path)
        self.fused = spec.compile_logprobs and spec.tensor_parallel == 1
        # Built before _wrap puts process-group methods in the shared config, which the
        # attention layer may deepcopy (fewer key/value heads than tensor ranks).
        self.reference = (
            self._load(spec.model_path).requires_grad_(False) if spec.reference else None
        )
        self.model = self._wrap(policy)
        self.optimizer = self._optimizer()
        self.updates = 0
        self._weight_stream = None
        self._transfer: RankTransfer | None = None
        """This rank's side of the weight transfer to vLLM, once connected."""
        self._lr_multiplier = lr_multiplier(
            spec.schedule, spec.warmup_steps, spec.total_updates, spec.sft_updates,
            spec.sft_lr_scale,
        )  # fmt: skip

    # -- set-up ---------------------------------------------------------------------------------

    def _load(self, path: str) -> torch.nn.Module:
        model = build_model(self.bridge).to(self.device)
        self.bridge.load_weights([model], path)
        if self.spec.compile_layers and getattr(model, "decoder", None) is not None:
            compiled_layers.compile_layers(model.decoder.layers)
        return model

    def _wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )

        config = self.bridge.config
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, use_distributed_optimizer=self.distributed_optimizer
        )
        wrapped = DistributedDataParallel(config=config, ddp_config=ddp_config, module=model)
        config.no_sync_func = wrapped.no_sync
        # Our losses are normalised already: finalize without megatron's division by tokens.
        config.finalize_model_grads_func = lambda chunks, num_tokens=None, **kw: (
            finalize_model_grads(chunks, None, **kw)
        )
        return wrapped

    def _optimizer(self) -> Any:
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        spec = self.spec
        config = OptimizerConfig(
            optimizer="adam",
            lr=spec.lr,
            weight_decay=spec.weight_decay,
            adam_beta1=spec.betas[0],
            adam_beta2=spec.betas[1],
            clip_grad=spec.grad_clip or 0.0,
            bf16=spec.dtype == "bfloat16",
            fp16=spec.dtype == "float16",
            use_distributed_optimizer=self.distributed_optimizer,
        )
        # ``{}``: weight decay on every parameter, as the torch backend does.
        optimizer = get_megatron_optimizer(config, [self.model], config_overrides={})
        if self.distributed_optimizer:
            keep_states_a_load_leaves_out(optimizer)
        return optimizer

    # -- what the driver calls ------------------------------------------------------------------

    def rank_info(self) -> dict[str, Any]:
        """This rank's global rank, its tensor/pipeline/data-parallel ranks, and whether it is
        the rank that reports an update's metrics (``output``)."""
        from megatron.core import parallel_state as mpu

        return {
            "rank": torch.distributed.get_rank(),
            "tp": mpu.get_tensor_model_parallel_rank(),
            "pp": mpu.get_pipeline_model_parallel_rank(),
            "dp": mpu.get_data_parallel_rank(),
            "output": self._is_output_rank(),
        }

    def num_parameters(self) -> int:
        """Parameters of the whole model (summed over tensor and pipeline shards)."""
        from megatron.core import parallel_state as mpu

        first_tp = mpu.get_tensor_model_parallel_rank() == 0
        # A replicated parameter (the norms) is counted on the first tensor rank only.
        local = torch.tensor(
            [
                sum(
                    p.numel()
                    for p in self.model.parameters()
                    if first_tp or getattr(p, "tensor_model_parallel", False)
                )
            ],
            dtype=torch.long,
            device=self.device,  # NCCL reduces only CUDA tensors
        )
        torch.distributed.all_reduce(local, group=mpu.get_model_parallel_group())
        if mpu.get_pipeline_model_parallel_world_size() > 1 and getattr(
            self.bridge.hf_config, "tie_word_embeddings", False
        ):
            local -= (
                self.bridge.hf_config.vocab_size * self.bridge.hf_config.hidden_size
            )  # the last stage's copy
        return int(local)

    @torch.no_grad()
    def logprobs(
        self, batches: list[MicroBatch], reference: bool = False, temperature: float | None = None
    ) -> dict[int, torch.Tensor] | None:
        """Token logprobs of this data rank's share of ``batches``, keyed by micro-batch index, on
        the first tensor rank of the last stage; ``None`` on the others (they still take part)."""
        model = self.reference if reference else self.model
        if model is None:
            raise ValueError("reference logprobs need a reference model (algorithm.kl_beta > 0)")
        scale = temperature or self.spec.temperature

        def token_logprobs(
            mb: MicroBatch, packing: Packing, row: torch.Tensor, output: torch.Tensor
        ) -> torch.Tensor:
            logits, targets = _next_token_logits(output, row)
            if self.fused:
                logprobs = fused_logprobs(logits, targets, scale)[0]
            else:
                logprobs = chunked_logprobs(logits, targets, scale)
            return packing.unpack(logprobs, mb.input_ids.shape[1])

        return self._collect(model, batches, token_logprobs)

    def update(
        self,
        batches: list[MicroBatch],
        spec: ObjectiveSpec,
        *,
        old_logprobs: list[torch.Tensor] | None,
        ref_logprobs: list[torch.Tensor] | None,
        num_tokens: int,
        num_sequences: int,
    ) -> dict[str, float] | None:
        """One optimizer update over ``batches``; its metrics on the output rank, else ``None``."""
        loss = partial(self._loss, spec, old_logprobs, ref_logprobs, num_tokens, num_sequences)
        return self._train_on(_uniform_supervision(batches), loss)

    def _collect(
        self, model: torch.nn.Module, batches: list[MicroBatch], extract: Callable
    ) -> dict[int, torch.Tensor] | None:
        """``extract(mb, packing, row, output)`` of this data rank's share of ``batches`` in eval
        mode, keyed by micro-batch index, on the ranks that hold the output (:meth:`_holds_output`);
        ``None`` on the others (they still take part)."""

        def collect(
            k: int, mb: MicroBatch, packing: Packing, row: torch.Tensor, output: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
            report = {"index": k, "value": extract(mb, packing, row, output).cpu()}
            return output.new_zeros(()), torch.tensor(1, dtype=torch.int), report

        model.eval()
        try:
            reports = self._schedule(model, self._my_batches(batches), collect, forward_only=True)
        finally:
            model.train()
        if not self._holds_output():
            return None
        return {r["index"]: r["value"] for r in reports if r["index"] >= 0}

    def _train_on(self, batches: list[MicroBatch], loss: Callable) -> dict[str, float] | None:
        """One optimizer update: ``loss`` (``(k, mb, packing, row, output) -> (loss, count,
        report)``) over this data rank's share of ``batches``, data-parallel gradients summed,
        the learning rate of this update set; the summed reports as metrics on the output
        rank, else ``None``."""
        from megatron.core import parallel_state as mpu

        self.model.train()
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        reports = self._schedule(self.model, self._my_batches(batches), loss, forward_only=False)
        totals = _sum_reports(reports, self.device)  # NCCL reduces only CUDA tensors
        if mpu.is_pipeline_last_stage(ignore_virtual=True):
            torch.distributed.all_reduce(totals, group=mpu.get_data_parallel_group())
        for group in self.optimizer.param_groups:
            group["lr"] = self.spec.lr * self._lr_multiplier(self.updates)
        _, grad_norm, _ = self.optimizer.step()
        self.updates += 1
        if not self._is_output_rank():
            return None
        metrics = _metrics(totals, reports, grad_norm, self.optimizer.param_groups[0]["lr"])
        if self.fused or self.spec.compile_layers:
            metrics["compile_s"] = compiled_layers.compile_seconds()
        return metrics

    def hf_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The whole model under HF names on rank 0 (CPU tensors); ``None`` elsewhere."""
        weights = {
            name: tensor.detach().to("cpu", copy=True)
            for name, tensor in hf_weights(self.bridge, [self.model.module])
        }
        return weights if torch.distributed.get_rank() == 0 else None

    def begin_weights(self) -> None:
        """Start streaming the HF weights (see :meth:`next_weights`)."""
        self._weight_stream: Iterator[tuple[str, torch.Tensor]] | None = hf_weights(
            self.bridge, [self.model.module]
        )

    def next_weights(self, max_bytes: int) -> list[tuple[str, torch.Tensor]] | None:
        """The stream's next tensors, at least one and about ``max_bytes`` in all, on rank 0
        (``None`` on the others); ``[]`` on every rank when the stream is done. Every rank must
        call it: each tensor is gathered from its shards by collectives, so only one bucket is
        ever held at once."""
        if self._weight_stream is None:
            raise RuntimeError("call begin_weights first")
        chunk: list[tuple[str, torch.Tensor]] = []
        size = 0
        for name, tensor in self._weight_stream:  # the same tensors, in order, on every rank
            chunk.append((name, tensor.detach().to("cpu", copy=True)))
            size += tensor.numel() * tensor.element_size()
            if size >= max_bytes:
                break
        if not chunk:
            self._weight_stream = None
            return []
        return chunk if torch.distributed.get_rank() == 0 else None

    def connect_weight_transfer(self, plan: TransferPlan) -> dict[str, Any] | None:
        """Join the weight transfer that ``plan`` describes (``weight_sync.ranks``): rank 0
        sends straight to the engines (NCCL rendezvous on its node, CUDA IPC from its GPU, or the
        shared file on its host); every rank gathers the weights with it on each
        :meth:`send_weights`. Rank 0 returns where it sends from; the others ``None``."""
        from envhub.trainer.weight_sync.ranks import RankTransfer

        self.close_weight_transfer()
        rank = torch.distributed.get_rank()
        address = os.environ.get("MASTER_ADDR", "127.0.0.1")  # rank 0's node, where it listens
        self._transfer = RankTransfer.connect(
            plan, lambda: hf_weights(self.bridge, [self.model.module]), rank=rank, address=address
        )
        return {"rank": rank, "node": address, "pid": os.getpid()} if rank == 0 else None

    def send_weights(self) -> tuple[int, int] | None:
        """One sync over the connected transfer (every rank takes part); on rank 0 the buckets
        and bytes it sent (plain ints: they travel over Ray), else ``None``."""
        if self._transfer is None:
            raise RuntimeError("call connect_weight_transfer first")
        sent = self._transfer.send()
        return (sent.buckets, sent.bytes) if sent is not None else None

    def close_weight_transfer(self) -> None:
        """Leave the transfer (its shared file, communicator and HTTP clients); idempotent."""
        if self._transfer is not None:
            self._transfer.close()
            self._transfer = None

    def export(self, target: str) -> str | None:
        """Save the model as an HF folder (safetensors, config, tokenizer) from rank 0."""
        from envhub.trainer.checkpoint import export_hf_weights

        weights = self.hf_state_dict()
        if weights is None:
            return None
        return str(export_hf_weights(weights, self.spec.model_path, target))

    def save_checkpoint(self, folder: str) -> None:
        """Model and optimizer shards in Megatron's distributed format (every rank writes its
        part; ``folder`` must be on storage all nodes share), plus the update counter."""
        from megatron.core import dist_checkpointing

        Path(folder).mkdir(parents=True, exist_ok=True)
        dist_checkpointing.save(self._sharded_state(), folder)
        if torch.distributed.get_rank() == 0:
            (Path(folder) / WORKER_STATE).write_text(json.dumps({"updates": self.updates}))
        torch.distributed.barrier()

    def load_checkpoint(self, folder: str) -> None:
        """Fill the model and optimizer from :meth:`save_checkpoint`'s folder, for any layout
        that splits the same model (the format is resharded on load)."""
        from megatron.core import dist_checkpointing

        loaded = dist_checkpointing.load(self._sharded_state(loading=True), folder)
        self.model.module.load_state_dict(loaded["model"])
        self.optimizer.load_state_dict(loaded["optimizer"])
        unshare_steps(self.optimizer)
        self.updates = json.loads((Path(folder) / WORKER_STATE).read_text())["updates"]

    def _sharded_state(self, loading: bool = False) -> dict[str, Any]:
        state = {"model": self.model.module.sharded_state_dict()}
        state["optimizer"] = self.optimizer.sharded_state_dict(
            state["model"], is_loading=loading, metadata=CHECKPOINT_METADATA
        )
        return state

    def shutdown(self) -> None:
        """Leave the weight transfer, then tear down Megatron's parallel state and the
        ``torch.distributed`` process group."""
        from megatron.core import parallel_state as mpu

        self.close_weight_transfer()
        mpu.destroy_model_parallel()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()

    # -- internals ------------------------------------------------------------------------------

    def _loss(
        self,
        spec: ObjectiveSpec,
        old: list | None,
        ref: list | None,
        num_tokens: int,
        num_sequences: int,
        k: int,
        mb: MicroBatch,
        packing: Packing,
        row: torch.Tensor,
        output: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        weight = float(mb.num_tokens)  # counted on the host, before the batch moves
        mb = mb.to(output.device)
        width = mb.input_ids.shape[1]
        logits, targets = _next_token_logits(output, row)
        logprobs, entropy = self._scores(logits, targets)
        logprobs, entropy = packing.unpack(logprobs, width), packing.unpack(entropy, width)
        loss, metrics = policy_objective(
            spec,
            logprobs=logprobs,
            old_logprobs=to_device(old[k], output.device) if old and k >= 0 else None,
            advantages=mb.advantages,
            mask=mb.loss_mask,
            num_tokens=num_tokens,
            num_sequences=num_sequences,
            sampler_logprobs=mb.sampler_logprobs,
            ref_logprobs=to_device(ref[k], output.device) if ref and k >= 0 else None,
            entropy=entropy,
            supervised=mb.supervised,
        )
        return loss, torch.tensor(1, dtype=torch.int), micro_batch_report(loss, weight, metrics)

    def _scores(
        self, logits: torch.Tensor, targets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The packed row's logprobs and entropies: fused where it may run (one tensor rank, the
        entropy a metric), else chunked with the tensor-parallel collectives."""
        temperature = self.spec.temperature
        if self.fused and not self.spec.entropy_coef:
            return fused_logprobs(logits, targets, temperature)
        logprobs = chunked_logprobs(logits, targets, temperature)
        if self.spec.entropy_coef:  # a loss term: whole, with grad
            return logprobs, vocab_parallel_entropy(logits.float() / temperature)
        return logprobs, vocab_parallel_entropy_report(logits, temperature)

    def _my_batches(self, batches: list[MicroBatch]) -> list[tuple[int, MicroBatch]]:
        """This data rank's micro-batches, round-robin. Every data rank runs the same number of
        them (a short rank repeats its first one with an empty loss mask, index -1), so the
        pipeline schedules line up and a rank never runs zero micro-batches."""
        from megatron.core import parallel_state as mpu

        rank, size = mpu.get_data_parallel_rank(), mpu.get_data_parallel_world_size()
        mine = [(k, batches[k]) for k in range(rank, len(batches), size)]
        count = -(-len(batches) // size)
        filler = _empty_like(batches[0])
        return mine + [(-1, filler)] * (count - len(mine))

    def _schedule(
        self,
        model: torch.nn.Module,
        batches: list[tuple[int, MicroBatch]],
        loss: Callable,
        *,
        forward_only: bool,
    ) -> list[dict[str, Any]]:
        """Run ``batches`` through the pipeline schedule, each packed into one row; ``loss`` gets
        ``(k, mb, packing, row, output)`` (``row``: the packed token ids, built once per
        micro-batch)."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        packings = [Packing.of(mb, multiple=self._row_multiple(mb)) for _, mb in batches]

        def forward_step(data: Any, model: torch.nn.Module) -> tuple[torch.Tensor, Callable]:
            (k, mb), packing = next(data)
            row = packing.row(mb.input_ids)
            return self._forward(model, row, packing), partial(loss, k, mb, packing, row)

        return get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=zip(batches, packings, strict=True),
            model=[model],
            num_microbatches=len(batches),
            seq_length=max(p.total for p in packings),
            micro_batch_size=1,
            forward_only=forward_only,
        )

    def _forward(self, model: torch.nn.Module, row: torch.Tensor, packing: Packing) -> torch.Tensor:
        """The packed ``row`` through the model, each sequence attending only to itself: THD
        varlen attention with Transformer Engine; else ``attention.PackedAttention`` given the
        sequences' lengths in place of the mask."""
        ids = to_device(row, self.device)
        positions = to_device(packing.positions(), self.device)
        if have_transformer_engine():
            params = packed_seq_params(packing, self.device)
            return model(ids, positions, None, packed_seq_params=params)
        return model(ids, positions, segment_lengths(packing.segments))

    def _row_multiple(self, mb: MicroBatch) -> int:
        """What ``mb``'s packed row is padded to a multiple of: the tensor ranks' count for a
        sequence-parallel split, and with compiled layers its bucket's granule (so the row's
        length is :func:`compiled_layers.bucket_length`)."""
        from megatron.core import parallel_state as mpu

        split = (
            mpu.get_tensor_model_parallel_world_size()
            if self.bridge.config.sequence_parallel
            else 1
        )
        if not self.spec.compile_layers:
            return split
        return math.lcm(split, compiled_layers.bucket_granule(int(mb.attention_mask.sum())))

    def _holds_output(self) -> bool:
        """The first tensor rank of the last pipeline stage (one per data-parallel rank)."""
        from megatron.core import parallel_state as mpu

        return (
            mpu.is_pipeline_last_stage(ignore_virtual=True)
            and mpu.get_tensor_model_parallel_rank() == 0
        )

    def _is_output_rank(self) -> bool:
        """The rank that reports a whole update's metrics."""
        from megatron.core import parallel_state as mpu

        return self._holds_output() and mpu.get_data_parallel_rank() == 0


def _next_token_logits(
    output: torch.Tensor, row: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits of the packed ``row`` that predict each next token (as the model returned
    them: the losses divide by the temperature in float32, scoring the distribution the engine
    sampled from as the torch backend does), and those tokens."""
    return output[:, :-1], to_device(row[:, 1:], output.device)


def _uniform_supervision(batches: list[MicroBatch]) -> list[MicroBatch]:
    """``batches``, each with a ``supervised`` tensor (zeros where it had none) when any has
    one: every micro-batch on every data rank then reports the same metrics, which the
    all-reduce of their sums needs (an all-zero weight changes no loss)."""
    if all(mb.supervised is None for mb in batches):
        return batches
    return [
        mb
        if mb.supervised is not None
        else replace(mb, supervised=torch.zeros_like(mb.loss_mask, dtype=torch.float32))
        for mb in batches
    ]


def _empty_like(mb: MicroBatch) -> MicroBatch:
    zeros = torch.zeros_like(mb.loss_mask)
    return MicroBatch(
        mb.input_ids,
        mb.attention_mask,
        zeros,
        torch.zeros_like(mb.sampler_logprobs),
        mb.advantages,
        [],
        supervised=None if mb.supervised is None else torch.zeros_like(mb.supervised),
    )


def micro_batch_report(
    loss: torch.Tensor, weight: float, metrics: dict[str, Any]
) -> dict[str, torch.Tensor | float]:
    """A micro-batch's loss and its metrics times ``weight``, left on the device: reading them
    here would make the host wait for the GPU after every forward pass instead of queueing the
    backward pass."""
    return {
        "loss": loss.detach().double(),
        "weight": weight,
        **{name: torch.as_tensor(v).detach().double() * weight for name, v in metrics.items()},
    }


def _sum_reports(reports: list[dict[str, Any]], device: torch.device) -> torch.Tensor:
    """This rank's reports summed, as one float64 tensor on ``device`` (keys in sorted order),
    for one all-reduce."""
    keys = sorted(reports[0]) if reports else []
    sums = [sum(r[key] for r in reports) for key in keys]
    if not sums:
        return torch.zeros(0, dtype=torch.float64, device=device)
    return torch.stack([torch.as_tensor(v, dtype=torch.float64, device=device) for v in sums])


def _metrics(
    totals: torch.Tensor, reports: list[dict[str, Any]], grad_norm: float | None, lr: float
) -> dict[str, float]:
    summed = dict(zip(sorted(reports[0]), totals.tolist(), strict=True))
    weight = max(summed.pop("weight"), 1.0)
    metrics = {
        name: (value if name == "loss" else value / weight) for name, value in summed.items()
    }
    metrics["grad_norm"] = float(grad_norm or 0.0)
    metrics["lr"] = lr
    return metrics


def _run_setup_file() -> None:
    path = os.environ.get(SETUP_ENV)
    if not path:
        return
    spec = importlib.util.spec_from_file_location("envhub_megatron_worker_setup", path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"{SETUP_ENV}={path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    # Registered, as an import would: torch.compile re-imports the globals of what it traces.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)


def _init_distributed() -> torch.device:
    """torch.distributed from the environment: NCCL on this rank's GPU, else gloo."""
    if torch.cuda.is_available():
        # Under Ray a rank sees only its own GPU (as cuda:0); under torchrun it sees the node's.
        device = torch.device(
            "cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
        )
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend, init_method="env://")
    return device
