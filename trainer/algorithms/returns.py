"""Credit over time: discounted returns, per-turn advantages and GAE.

``credit: turn`` gives each assistant turn its own reward (what ``env.step`` returned for it),
so a turn is credited with what happened from it on, not before it:

    G_k = r_k + gamma * r_{k+1} + gamma^2 * r_{k+2} + ...        (the return from turn k)

:func:`per_turn_advantages` then applies a REINFORCE-family baseline to these returns *per turn
position*: turn ``k`` of a sample is compared with turn ``k`` of the other samples of its group
(GRPO, Dr.GRPO, RLOO, the group mean of REINFORCE++-baseline), so a sample is never compared
with a later or earlier point of an episode; REINFORCE++ whitens all turn returns of the batch
together. A position that only one sample of its group reached gets 0 from the group
estimators (nothing to compare it with), as a group of one does today.

:func:`gae` is generalised advantage estimation (Schulman et al., 2016) over any sequence of
steps, turns or tokens, with masked steps skipped: between two policy turns the tool's reply
is not a step of the policy, so its tokens get no advantage and the recursion passes over them.
It needs values from a critic (``trainer/critic/``: its targets and the model that learns them).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ._common import as_bool_mask
from .advantages import compute_advantages
from .registry import turn_estimators


def _as_2d(values: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor, bool]:
    """``values`` as ``(B, T)`` (a ``(T,)`` sequence becomes one row) and its mask as bool."""
    flat = values.dim() == 1
    values = values[None] if flat else values
    if mask is None:
        mask = torch.ones_like(values, dtype=torch.bool)
    else:
        mask = as_bool_mask(mask[None] if flat else mask, values)
    return values, mask, flat


def discounted_returns(rewards: Tensor, gamma: float, mask: Tensor | None = None) -> Tensor:
    """``G_t = r_t + gamma * G_next`` from the end, ``G_next`` being the next unmasked step's.

    Args:
        rewards: ``(T,)`` or ``(B, T)`` reward of each step (turn or token).
        gamma: Discount in ``(0, 1]``.
        mask: Optional 0/1 like ``rewards``: masked steps are skipped (their reward is ignored,
            their return is 0, and the discount does not count them).

    Returns:
        The returns, shaped like ``rewards``.
    """
    r, mask, flat = _as_2d(rewards, mask)
    out = torch.zeros_like(r)
    running = torch.zeros_like(r[:, 0]) if r.shape[1] else r.new_zeros(r.shape[0])
    for t in reversed(range(r.shape[1])):
        value = r[:, t] + gamma * running
        running = torch.where(mask[:, t], value, running)
        out[:, t] = torch.where(mask[:, t], value, torch.zeros_like(value))
    return out[0] if flat else out


def gae(
    rewards: Tensor,
    values: Tensor,
    gamma: float,
    lam: float,
    mask: Tensor | None = None,
    last_value: Tensor | float = 0.0,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over a sequence of steps (turns or tokens).

    ``delta_t = r_t + gamma * V_next - V_t`` and ``A_t = delta_t + gamma * lam * A_next``, where
    ``next`` is the next *unmasked* step; after the last step ``V_next = last_value`` (0: the
    episode ended). Masked steps (a tool's reply, the prompt, padding) are no steps of the
    policy: they get advantage and return 0, and their rewards and values are ignored, so put
    a turn's reward on one of its own steps (its last token).

    Args:
        rewards: ``(T,)`` or ``(B, T)``.
        values: The critic's value of each step, shaped like ``rewards``.
        gamma: Discount in ``(0, 1]``.
        lam: GAE's lambda in ``[0, 1]``: 0 is the one-step TD error, 1 the Monte-Carlo return
            minus the value.
        mask: Optional 0/1 like ``rewards``; 1 on the policy's steps.
        last_value: Value after the last step (bootstrap for a cut episode), scalar or ``(B,)``.

    Returns:
        ``(advantages, returns)`` shaped like ``rewards``; ``returns = advantages + values`` on
        the unmasked steps (the critic's targets), 0 elsewhere.
    """
    if values.shape != rewards.shape:
        raise ValueError(f"values {tuple(values.shape)} != rewards {tuple(rewards.shape)}")
    r, mask, flat = _as_2d(rewards, mask)
    v = values[None] if flat else values
    zeros = torch.zeros_like(r[:, 0])
    next_value = zeros + torch.as_tensor(last_value, dtype=r.dtype, device=r.device)
    running = zeros
    advantages = torch.zeros_like(r)
    for t in reversed(range(r.shape[1])):
        delta = r[:, t] + gamma * next_value - v[:, t]
        value = delta + gamma * lam * running
        running = torch.where(mask[:, t], value, running)
        next_value = torch.where(mask[:, t], v[:, t], next_value)
        advantages[:, t] = torch.where(mask[:, t], value, zeros)
    returns = torch.where(mask, advantages + v, torch.zeros_like(r))
    return (advantages[0], returns[0]) if flat else (advantages, returns)


def per_turn_advantages(
    name: str, returns: Sequence[Tensor], group_ids: Tensor, **kwargs: object
) -> list[Tensor]:
    """Advantages of every turn by the estimator ``name`` applied per turn position.

    The returns of turn ``k`` of the samples of one group form a group of their own (group
    ``(g, k)``), so GRPO, Dr.GRPO and RLOO compare turn ``k`` with turn ``k`` of the samples
    that reached it, and REINFORCE++-baseline subtracts that mean before whitening over every
    turn of the batch; REINFORCE++ ignores groups and whitens every turn return of the batch.
    Each turn counts once, whatever its length.

    Args:
        name: An outcome estimator registered with ``turn_credit`` (``registry.turn_estimators``).
        returns: One ``(T_i,)`` tensor per sample: the return from each of its turns.
        group_ids: ``(N,)`` integer group of each sample.
        **kwargs: Estimator options (``eps``, ...).

    Returns:
        One ``(T_i,)`` tensor per sample: the advantage of each of its turns.

    Raises:
        ValueError: ``name`` cannot be applied per turn (it needs whole sequences).
    """
    if name not in turn_estimators():
        valid = ", ".join(sorted(turn_estimators()))
        raise ValueError(f"advantage {name!r} cannot be applied per turn; valid: {valid}")
    if len(returns) != group_ids.numel():
        raise ValueError(f"{len(returns)} samples of returns but {group_ids.numel()} group ids")
    if not returns:
        return []
    counts = [int(r.numel()) for r in returns]
    flat = torch.cat([r.reshape(-1) for r in returns])
    _, group = torch.unique(group_ids, return_inverse=True)
    position = torch.cat([torch.arange(n) for n in counts])
    sample_group = torch.repeat_interleave(group, torch.tensor(counts))
    turn_group = sample_group * (max(counts) + 1) + position
    advantages = compute_advantages(name, flat, turn_group, **kwargs)
    return list(torch.split(advantages, counts))
