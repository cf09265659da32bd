"""The Megatron backend's critic: megatron-core value-model ranks placed by Ray.

:class:`MegatronCritic` is the :class:`~envhub.trainer.critic.Critic` of a run with
``backend.kind: megatron`` and ``algorithm.advantage: gae``. It starts a worker group of its own
(:class:`~envhub.trainer.megatron.critic_worker.MegatronCriticWorker` ranks) with the policy's
tensor/pipeline/data-parallel layout, checked the same way against the critic's model; on GPUs
the policy and the critic each take half of the trainer's GPUs (``plan``). Sequences are cut
into packed micro-batches as the policy's are (``backend.micro_batch_tokens``, or
``critic.micro_batch_tokens``), dealt over the data-parallel ranks, and the value loss is
normalised by the whole update's count of value places, so the update equals the torch
critic's for any split (tested under TP=2, PP=2 and DP=2). Checkpoints hold its shards in
megatron-core's distributed format under ``critic/model``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from envhub.trainer.batch import Batch, Sample, micro_batches
from envhub.trainer.cluster.placement import WorkerGroup
from envhub.trainer.config import TrainConfig
from envhub.trainer.critic.targets import stack_targets, value_places
from envhub.trainer.megatron.backend import (
    ShardedCheckpoint,
    _worker_env,
    check_layout,
    plan,
    rank_budget,
    worker_spec,
)
from envhub.trainer.megatron.critic_worker import MegatronCriticWorker
from envhub.trainer.megatron.worker import WorkerSpec
from envhub.trainer.models import resolve_model


class MegatronCritic:
    """The critic's ranks and the calls the loop makes (see the module docstring).

    Args:
        config: The run (``critic`` for the critic's own model and optimizer).
        pad_id: The tokenizer's pad id (packed rows are padded at their end only).
    """

    def __init__(self, config: TrainConfig, pad_id: int) -> None:
        self.pad_id = pad_id
        self.model_path = resolve_model(config.critic.model or config.model.name)
        placement, layout = plan(config)
        self.budget = config.critic.micro_batch_tokens or rank_budget(config, placement)
        check_layout(self.model_path, *layout[:2])
        self.group = WorkerGroup(
            MegatronCriticWorker,
            placement,
            env=_worker_env(config),
            args=(critic_spec(config, self.model_path, placement), config.critic.value_clip),
            name="envhub-megatron-critic",
        )

    def values(self, sequences: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Each sequence's ``(L - 1,)`` float64 values, gathered from the ranks that hold them."""
        if not sequences:
            return []
        samples = [
            Sample(list(ids), [1] * len(ids), [0.0] * len(ids), 0.0, i)
            for i, ids in enumerate(sequences)
        ]
        mbs = micro_batches(Batch(samples), self.budget, self.pad_id, packed=True)
        merged: dict[int, torch.Tensor] = {}
        for part in self.group.call("values", mbs):
            merged |= part or {}
        out: list[torch.Tensor | None] = [None] * len(sequences)
        for k, mb in enumerate(mbs):
            for row, i in enumerate(mb.samples):
                out[i] = merged[k][row, : len(sequences[i]) - 1].double()
        return [v for v in out if v is not None]

    def update(self, samples: Sequence[Sample]) -> dict[str, float]:
        """One optimizer update on the samples' value targets; the ranks' metrics as the torch
        critic names them."""
        mbs = micro_batches(Batch(list(samples)), self.budget, self.pad_id, packed=True)
        targets = [
            stack_targets([samples[i].value_target for i in mb.samples], mb.input_ids.shape[1] - 1)
            for mb in mbs
        ]
        results = self.group.call("update_values", mbs, targets, value_places(samples))
        metrics = next(r for r in results if r is not None)
        return {
            "value_loss": metrics["loss"],
            "value_clip_frac": metrics["clip_frac"],
            "value_error": metrics["error"],
            "grad_norm": metrics["grad_norm"],
            "lr": metrics["lr"],
        }

    def state(self) -> dict[str, Any]:
        """The ranks' shards (model and optimizer) for ``critic/model``; no separate optimizer
        or scheduler file."""
        return {"model": ShardedCheckpoint(self.group), "optimizer": None, "scheduler": None}

    def close(self) -> None:
        """Shut the critic's ranks down."""
        self.group.shutdown()


def critic_spec(config: TrainConfig, model_path: str, placement: Any) -> WorkerSpec:
    """The policy's rank settings with the critic's model and optimizer (constant learning
    rate, no reference model, no entropy)."""
    c = config.critic
    return replace(
        worker_spec(config, model_path, placement),
        lr=c.lr,
        weight_decay=c.weight_decay,
        grad_clip=c.grad_clip,
        schedule="constant",
        warmup_steps=0,
        entropy_coef=0.0,
        reference=False,
    )
