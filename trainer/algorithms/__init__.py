"""The trainer's RL algorithms as small pure torch functions, each family behind a registry.

    advantages      ADVANTAGE_ESTIMATORS   grpo, dr_grpo, rloo, reinforce++, reinforce++_baseline,
                                           opo, gpg, remax
    returns         discounted_returns, per_turn_advantages (credit: turn), gae
    value           clipped_value_loss, explained_variance, masked_whiten (the critic's side)
    policy_losses   POLICY_LOSSES          ppo_clip (decoupled clip, dual clip), gspo
    aggregation     AGGREGATIONS           token-mean, seq-mean-token-mean, seq-mean-token-sum-norm
    kl              KL_ESTIMATORS          k1, k2, k3
    kl_control      fixed / adaptive KL-in-reward controllers, kl_token_rewards
    mismatch        MISMATCH_MODES         tis, mask-token, mask-sequence, none
    entropy         token_entropy, selective_log_softmax
    filtering       zero_variance_groups, overlong_penalty, overlong_filter_mask
    objective       ObjectiveSpec, policy_objective: all of the above for one micro-batch

Unknown names raise ``envhub.errors.ConfigError`` listing the valid ones. Adding an algorithm
is adding a function and a registry entry.
"""

from __future__ import annotations

from .advantages import ADVANTAGE_ESTIMATORS, compute_advantages, group_stats
from .aggregation import AGGREGATIONS, aggregate
from .entropy import selective_log_softmax, token_entropy
from .filtering import overlong_filter_mask, overlong_penalty, zero_variance_groups
from .kl import KL_ESTIMATORS, kl_penalty
from .kl_control import KLController, kl_token_rewards, make_kl_controller, measured_kl
from .mismatch import MISMATCH_MODES, mismatch_weights
from .objective import ObjectiveSpec, policy_objective
from .policy_losses import POLICY_LOSSES, compute_policy_loss, gspo, ppo_clip
from .returns import TURN_ESTIMATORS, discounted_returns, gae, per_turn_advantages
from .value import clipped_value_loss, explained_variance, masked_whiten

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "KLController",
    "MISMATCH_MODES",
    "POLICY_LOSSES",
    "TURN_ESTIMATORS",
    "ObjectiveSpec",
    "aggregate",
    "clipped_value_loss",
    "compute_advantages",
    "compute_policy_loss",
    "discounted_returns",
    "explained_variance",
    "gae",
    "group_stats",
    "gspo",
    "kl_penalty",
    "kl_token_rewards",
    "make_kl_controller",
    "masked_whiten",
    "measured_kl",
    "mismatch_weights",
    "overlong_filter_mask",
    "overlong_penalty",
    "per_turn_advantages",
    "policy_objective",
    "ppo_clip",
    "selective_log_softmax",
    "token_entropy",
    "zero_variance_groups",
]
