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

import math
import warnings
from collections.abc import Callable
from functools import partial
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
    load_bridge,
)
from envhub.trainer.megatron.grad_norm import use_device_grad_norm
from envhub.trainer.megatron.loss import (
    chunked_logprobs,
    vocab_parallel_entropy,
    vocab_parallel_entropy_report,
)
from envhub.trainer.megatron.micro_batches import (
    empty_like,
    micro_batch_report,
    sum_reports,
    uniform_supervision,
    update_metrics,
)
from envhub.trainer.megatron.rank_setup import init_distributed, run_setup_file
from envhub.trainer.megatron.torch_adam import keep_states_a_load_leaves_out
from envhub.trainer.megatron.worker_io import WeightsAndCheckpoints
from envhub.trainer.megatron.worker_spec import WorkerSpec
from envhub.trainer.megatron.worker_steps import SplitSteps

if TYPE_CHECKING:
    from envhub.trainer.weight_sync.ranks import RankTransfer

__all__ = ["MegatronWorker", "WorkerSpec"]

RECOMPUTE = {
    "recompute_granularity": "full",
    "recompute_method": "uniform",
    "recompute_num_layers": 1,
}
"""megatron-core's settings for ``model.gradient_checkpointing`` (what the torch backend's HF
gradient checkpointing does: keep each layer's input, recompute the layer)."""

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class MegatronWorker(SplitSteps, WeightsAndCheckpoints):
    """A rank: sets up torch.distributed and Megatron's parallel state from the environment
    (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, ``LOCAL_RANK``), then builds its
    model shard from the HF checkpoint."""

    def __init__(self, spec: WorkerSpec) -> None:
        # Without Transformer Engine/Apex megatron-core warns once per module; the fallbacks are
        # the point on machines without them (GPU runs with TE do not take them).
        warnings.filterwarnings("ignore", message=r".*(Apex|Transformer Engine).* not installed")
        run_setup_file()
        use_device_grad_norm()
        from megatron.core import parallel_state as mpu
        from megatron.core import tensor_parallel

        self.spec = spec
        self.device = init_distributed()
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
            return packing.unpack(self._row_logprobs(output, row, scale), mb.input_ids.shape[1])

        return self._collect(model, batches, token_logprobs)

    def _row_logprobs(self, output: torch.Tensor, row: torch.Tensor, scale: float) -> torch.Tensor:
        """The logprob of each next token of the packed ``row`` under ``output``'s logits at
        temperature ``scale`` (fused where it may run), ``[1, total - 1]``."""
        logits, targets = _next_token_logits(output, row)
        if self.fused:
            return fused_logprobs(logits, targets, scale)[0]
        return chunked_logprobs(logits, targets, scale)

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
        return self._train_on(uniform_supervision(batches), loss)

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
        totals = sum_reports(reports, self.device)  # NCCL reduces only CUDA tensors
        if mpu.is_pipeline_last_stage(ignore_virtual=True):
            torch.distributed.all_reduce(totals, group=mpu.get_data_parallel_group())
        for group in self.optimizer.param_groups:
            group["lr"] = self.spec.lr * self._lr_multiplier(self.updates)
        _, grad_norm, _ = self.optimizer.step()
        self.updates += 1
        if not self._is_output_rank():
            return None
        metrics = update_metrics(totals, reports, grad_norm, self.optimizer.param_groups[0]["lr"])
        if self.fused or self.spec.compile_layers:
            metrics["compile_s"] = compiled_layers.compile_seconds()
        return metrics

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
        filler = empty_like(batches[0])
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
