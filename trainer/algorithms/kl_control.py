"""KL to the reference model as a penalty in the reward, with a fixed or adaptive coefficient.

Beside the KL term in the loss (``kl_beta``), the KL can be charged in the reward, as in RLHF's
PPO (Ziegler et al., 2019, "Fine-Tuning Language Models from Human Preferences"): each token the
policy sampled gets the reward ``-coef * kl_t``, and the advantages are estimated from rewards
that include it. The coefficient is fixed, or adapted after every step by a proportional
controller that steers the measured KL towards ``target_kl``:

    error = clip(current_kl / target_kl - 1, -0.2, 0.2)
    coef <- coef * (1 + error * n_steps / horizon)

``n_steps`` is the number of sequences the step's KL was measured on and ``horizon`` how many
sequences the controller takes to close most of the gap. A controller's ``state_dict`` goes
into the checkpoint, so a resumed run goes on with the coefficient it had.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ._common import as_bool_mask, masked_mean
from .kl import kl_penalty


@dataclass(frozen=True)
class KLState:
    """What a checkpoint keeps of a KL controller: its coefficient."""

    coef: float

    def to_json(self) -> dict[str, Any]:
        """Plain values."""
        return {"coef": self.coef}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KLState:
        """The state :meth:`to_json` wrote."""
        return cls(float(data["coef"]))


@dataclass
class FixedKLController:
    """A coefficient that never changes."""

    coef: float

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing to adapt."""

    def state_dict(self) -> dict[str, Any]:
        """The coefficient (:class:`KLState`, JSON-ready)."""
        return KLState(self.coef).to_json()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the coefficient saved by :meth:`state_dict`."""
        self.coef = KLState.from_json(state).coef


@dataclass
class AdaptiveKLController:
    """Ziegler et al.'s proportional controller (see the module docstring).

    Attributes:
        coef: The current coefficient (the initial one until the first update).
        target_kl: The KL per token the controller steers towards (> 0).
        horizon: Sequences over which the gap mostly closes (> 0).
    """

    coef: float
    target_kl: float
    horizon: int

    def __post_init__(self) -> None:
        if self.target_kl <= 0 or self.horizon <= 0:
            raise ValueError(f"need target_kl > 0 and horizon > 0, got {self}")

    def update(self, current_kl: float, n_steps: int) -> None:
        """Adapt the coefficient to the KL measured on ``n_steps`` sequences."""
        error = min(max(current_kl / self.target_kl - 1.0, -0.2), 0.2)
        self.coef *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, Any]:
        """The current coefficient (:class:`KLState`, JSON-ready)."""
        return KLState(self.coef).to_json()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the coefficient saved by :meth:`state_dict`."""
        self.coef = KLState.from_json(state).coef


KLController = FixedKLController | AdaptiveKLController


def make_kl_controller(
    kind: str, coef: float, target_kl: float | None = None, horizon: int | None = None
) -> KLController:
    """A ``fixed`` or ``adaptive`` controller starting at ``coef``.

    Raises:
        ValueError: Unknown ``kind``, or ``adaptive`` without ``target_kl`` and ``horizon``.
    """
    if kind == "fixed":
        return FixedKLController(coef)
    if kind == "adaptive":
        if target_kl is None or horizon is None:
            raise ValueError("an adaptive KL controller needs target_kl and horizon")
        return AdaptiveKLController(coef, target_kl, horizon)
    raise ValueError(f"unknown KL controller {kind!r}; valid: adaptive, fixed")


def kl_token_rewards(
    logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, coef: float, estimator: str = "k1"
) -> tuple[Tensor, Tensor]:
    """The KL penalty of each sampled token as a reward, and the KL the controller measures.

    Args:
        logprobs: ``(B,T)`` log-probs of the sampled tokens under the policy that sampled them
            (the trainer's, before the update).
        ref_logprobs: ``(B,T)`` log-probs under the reference model.
        mask: ``(B,T)`` 1 on the tokens the policy sampled.
        coef: The controller's current coefficient.
        estimator: ``k1`` (``logp - ref``, verl's ``kl``), ``k2`` or ``k3``.

    Returns:
        ``(rewards, sequence_kl)``: ``(B,T)`` ``-coef * kl_t`` (0 where ``mask`` is 0), and
        ``(B,)`` each sequence's mean KL per token; their mean over the step's sequences is the
        KL the controller sees (:func:`measured_kl`).
    """
    mask = as_bool_mask(mask, logprobs)
    kl = kl_penalty(estimator, logprobs.detach(), ref_logprobs, mask)
    rewards = torch.where(mask, -coef * kl, torch.zeros_like(kl))
    return rewards, masked_mean(kl, mask, dim=-1)


def measured_kl(sequence_kl: Tensor) -> float:
    """The step's KL for the controller: the mean of its sequences' mean KL per token (verl's
    ``current_kl``); 0.0 for no sequence."""
    return float(sequence_kl.mean()) if sequence_kl.numel() else 0.0
