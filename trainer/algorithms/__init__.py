"""The trainer's RL algorithms as small pure torch functions, each family behind a registry.

    registry        ADVANTAGES, POLICY_LOSSES, AGGREGATIONS, KL_ESTIMATORS, MISMATCH_MODES:
                    every algorithm's name and properties, torch-free (the config's source)
    advantages      grpo, dr_grpo, rloo, reinforce++, reinforce++_baseline, opo, gpg, remax
    returns         discounted_returns, per_turn_advantages (credit: turn), gae
    value           clipped_value_loss, explained_variance, masked_whiten (the critic's side)
    policy_losses   ppo_clip (decoupled clip, dual clip), gspo
    aggregation     token-mean, seq-mean-token-mean, seq-mean-token-sum-norm
    kl              k1, k2, k3
    kl_control      fixed / adaptive KL-in-reward controllers, kl_token_rewards
    mismatch        tis, mask-token, mask-sequence, none
    entropy         token_entropy, selective_log_softmax
    filtering       zero_variance_groups, overlong_penalty, overlong_filter_mask
    objective       ObjectiveSpec, policy_objective: all of the above for one micro-batch

Unknown names raise ``envhub.errors.ConfigError`` listing the valid ones. Adding an algorithm
is writing a function and registering it (see :mod:`.registry`); the config then accepts its
name and the trainer calls it.

The names below load their module on first access, so ``import
envhub.trainer.algorithms.registry`` (what the config imports) loads no torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_WHERE = {
    "ADVANTAGES": "registry",
    "AGGREGATIONS": "registry",
    "KL_ESTIMATORS": "registry",
    "MISMATCH_MODES": "registry",
    "POLICY_LOSSES": "registry",
    "turn_estimators": "registry",
    "compute_advantages": "advantages",
    "group_stats": "advantages",
    "aggregate": "aggregation",
    "selective_log_softmax": "entropy",
    "token_entropy": "entropy",
    "overlong_filter_mask": "filtering",
    "overlong_penalty": "filtering",
    "zero_variance_groups": "filtering",
    "kl_penalty": "kl",
    "KLController": "kl_control",
    "kl_token_rewards": "kl_control",
    "make_kl_controller": "kl_control",
    "measured_kl": "kl_control",
    "mismatch_weights": "mismatch",
    "ObjectiveSpec": "objective",
    "policy_objective": "objective",
    "compute_policy_loss": "policy_losses",
    "gspo": "policy_losses",
    "ppo_clip": "policy_losses",
    "discounted_returns": "returns",
    "gae": "returns",
    "per_turn_advantages": "returns",
    "clipped_value_loss": "value",
    "explained_variance": "value",
    "masked_whiten": "value",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
