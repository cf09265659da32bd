"""The critic of PPO (``algorithm.advantage: gae``): a value model beside the policy.

    scored rollouts -> critic.values -> GAE (targets.py) -> policy update -> critic.update

A critic is another model behind an interface of its own (:class:`Critic`), not a branch inside
the policy's update: the loop asks it for the values of the step's sequences before the
advantages, and hands it GAE's returns after the policy's update. ``torch_critic`` holds the
torch backend's (an HF token-classification model with one output, in the trainer's process);
``envhub.trainer.megatron.critic`` the Megatron backend's (megatron-core ranks on Ray).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from envhub.trainer.backends.base import TrainBackend
    from envhub.trainer.batch import Batch, Sample
    from envhub.trainer.config import TrainConfig


class Critic(Protocol):
    """What the training loop needs from a value model."""

    def values(self, sequences: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Each sequence's ``(L - 1,)`` values: place ``t`` is the state after tokens ``0..t``."""
        ...

    def update(self, samples: Sequence[Sample]) -> dict[str, float]:
        """One optimizer update on the samples' ``value_target`` s; returns its metrics."""
        ...

    def state(self) -> dict[str, Any]:
        """What a checkpoint saves (``model``, ``optimizer``, ``scheduler``), as
        ``CheckpointManager.save``'s ``critic`` takes it."""
        ...

    def close(self) -> None:
        """Release what the critic holds outside this process; idempotent."""
        ...


def update_critic(critic: Critic, batch: Batch, updates: int) -> dict[str, float]:
    """The critic's step: ``updates`` optimizer updates on the batch cut as the policy's is
    (``algorithm.updates_per_step`` mini-batches). Returns ``critic/*`` metrics: each update's
    metrics averaged, and how well the values the advantages used explained the returns
    (``explained_variance``, left out when the returns do not vary), with their means."""
    from envhub.trainer.algorithms import explained_variance

    targets = [s.value_target for s in batch.samples if s.value_target is not None]
    old = torch.cat([t.old_values[t.mask] for t in targets])
    returns = torch.cat([t.returns[t.mask] for t in targets])
    metrics = {
        "critic/values_mean": float(old.mean()) if old.numel() else 0.0,
        "critic/returns_mean": float(returns.mean()) if returns.numel() else 0.0,
    }
    explained = explained_variance(old, returns)
    if not math.isnan(explained):  # undefined when the returns do not vary: left out
        metrics["critic/explained_variance"] = explained
    updates = min(updates, len(batch.samples))
    for i in range(updates):
        for name, value in critic.update(batch.samples[i::updates]).items():
            metrics[f"critic/{name}"] = metrics.get(f"critic/{name}", 0.0) + value / updates
    return metrics


def describe_critic(config: TrainConfig) -> str:
    """The run's critic in one line, for the header: its model, learning rate, value clip, GAE
    settings and warm-up."""
    c, a = config.critic, config.algorithm
    clip = f"value clip {c.value_clip}" if c.value_clip is not None else "no value clip"
    warmup = f", policy waits {c.warmup_steps} steps" if c.warmup_steps else ""
    return (
        f"{c.model or config.model.name} + value head, lr {c.lr:g}, {clip}; GAE over "
        f"{a.gae_unit}s (gamma {a.gamma:g}, lambda {a.lam:g}, credit {a.credit}){warmup}"
    )


def make_critic(config: TrainConfig, backend: TrainBackend) -> Critic | None:
    """The run's critic (``None`` unless ``algorithm.advantage`` is ``gae``), on the policy's
    device and under its autocast."""
    if not config.algorithm.needs_critic:
        return None
    if config.backend.kind == "megatron":
        from envhub.trainer.megatron.critic import MegatronCritic

        return MegatronCritic(config, backend.pad_id)
    from envhub.trainer.critic.torch_critic import TorchCritic

    return TorchCritic(config, backend.device, backend.autocast_dtype)


__all__ = ["Critic", "describe_critic", "make_critic", "update_critic"]
