"""The Tinker API's built-in losses, by the names clients send (``loss_fn``).

Each takes one datum's target-token logprobs ``(T,)`` (with grad) and its ``loss_fn_inputs``
as tensors, and returns the per-token loss ``(T,)``; the datum's loss is its sum, and a
request's loss (``loss:sum``) the sum over its datums. Tinker defines them as sums, not
means: a client that wants a mean scales its ``weights`` or ``advantages``.

- ``cross_entropy``: ``-logprobs * weights``.
- ``importance_sampling``: ``-exp(logprobs - sampler logprobs) * advantages``.
- ``ppo``: envhub's :func:`~envhub.trainer.algorithms.policy_losses.ppo_clip` per token, its
  clip range from ``clip_low_threshold`` / ``clip_high_threshold`` (ratio bounds, 0.8 and 1.2
  by default). Like the trainer's, it clamps the log-ratio to +-20 before ``exp``, which
  touches only tokens the clip already holds.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from envhub.errors import ConfigError
from envhub.trainer.algorithms.policy_losses import ppo_clip

Loss = Callable[[Tensor, dict[str, Tensor], dict[str, float | str]], Tensor]


def _needs(inputs: dict[str, Tensor], loss: str, *names: str) -> list[Tensor]:
    missing = [n for n in names if n not in inputs]
    if missing:
        raise ConfigError(f"loss {loss!r} needs loss_fn_inputs {', '.join(missing)}")
    return [inputs[n] for n in names]


def cross_entropy(logprobs: Tensor, inputs: dict[str, Tensor], config: dict) -> Tensor:
    """Weighted negative log-likelihood of the target tokens (``weights``: 1 when absent)."""
    weights = inputs.get("weights")
    return -logprobs * (weights if weights is not None else torch.ones_like(logprobs))


def importance_sampling(logprobs: Tensor, inputs: dict[str, Tensor], config: dict) -> Tensor:
    """REINFORCE corrected by the ratio to the sampler's logprobs (``logprobs``)."""
    sampler, advantages = _needs(inputs, "importance_sampling", "logprobs", "advantages")
    return -torch.exp(logprobs - sampler) * advantages


def ppo(logprobs: Tensor, inputs: dict[str, Tensor], config: dict) -> Tensor:
    """PPO's clipped surrogate: ``-min(r * A, clip(r, low, high) * A)`` per token."""
    sampler, advantages = _needs(inputs, "ppo", "logprobs", "advantages")
    low = float(config.get("clip_low_threshold", 0.8))
    high = float(config.get("clip_high_threshold", 1.2))
    token_loss, _ = ppo_clip(
        logprobs[None], sampler[None], advantages[None], torch.ones_like(logprobs[None]),
        eps_low=1.0 - low, eps_high=high - 1.0,
    )  # fmt: skip
    return token_loss[0]


LOSSES: dict[str, Loss] = {
    "cross_entropy": cross_entropy,
    "importance_sampling": importance_sampling,
    "ppo": ppo,
}
"""The losses served, by Tinker's names."""


def get_loss(name: str) -> Loss:
    """The loss called ``name``.

    Raises:
        ConfigError: No such loss; the message lists those served.
    """
    if name not in LOSSES:
        raise ConfigError(f"loss_fn {name!r} is not served; use one of {', '.join(LOSSES)}")
    return LOSSES[name]
