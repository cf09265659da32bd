"""Each role of a multi-role env weighs the same in the update (``algorithm.role_balance``).

Under ``token-mean`` every loss token weighs the same, so a role that writes few tokens beside
roles that write many (a setter's one-line problem beside four solvers' worked answers) gets a
small share of each update. Balancing scales every sample of role ``r`` by

    w_r = total / (R * count_r)

where ``count_r`` is role ``r``'s share of the aggregation's unit in the batch (loss tokens for
``token-mean`` and ``seq-mean-token-sum-norm``, sequences for ``seq-mean-token-mean``), ``total``
their sum and ``R`` the roles present (seats of a role together; roles of different multi-role
envs side by side). A one-role env's samples in the same batch keep a factor of 1: the roles
share equally what their episodes weighed together. The aggregation's normaliser stays the
whole batch's, so the loss becomes the mean over roles of each role's own aggregate: with
``token-mean``, ``(1/R) * sum_r (sum of role r's token losses / role r's tokens)``. The scale is
applied to the advantages, which the policy losses (``ppo_clip``, ``gspo``, dual clip included)
are linear in for a positive factor, so the policy term is balanced exactly; a KL or entropy
term stays per token. A batch with one role (every one-role env) is left exactly as it was.

``algorithm.role_scale`` multiplies named roles' factors by hand (``{solver: 0.25}``: the
solver learns at a quarter of the rate, e.g. so that a setter can keep pace with it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from envhub.errors import ConfigError
from envhub.trainer.sample import Sample
from envhub.types import Trajectory

SEQUENCE_UNIT = frozenset({"seq-mean-token-mean"})
"""Aggregations that weigh sequences equally: roles are balanced by sequence counts there."""


def role_weights(
    samples: Sequence[Sample], trajectories: Sequence[Trajectory], aggregation: str
) -> dict[str, float]:
    """Each role's factor ``w_r`` (module docstring) over ``samples``, keyed by role name (seats
    together); ``{}`` when fewer than two roles have something in the loss. Samples of one-role
    envs are not counted."""
    counts: dict[str, float] = {}
    for sample in samples:
        role = trajectories[sample.trajectory].role_name
        if role is None:  # a one-role env's sample, beside a multi-role env's: left alone
            continue
        unit = 1 if aggregation in SEQUENCE_UNIT else sum(sample.loss_mask[1:])
        counts[role] = counts.get(role, 0.0) + unit
    counts = {role: n for role, n in counts.items() if n > 0}
    if len(counts) < 2:
        return {}
    total = sum(counts.values())
    return {role: total / (len(counts) * n) for role, n in counts.items()}


def balance_roles(
    samples: Sequence[Sample],
    trajectories: Sequence[Trajectory],
    aggregation: str,
    *,
    balance: bool = True,
    scale: Mapping[str, float] | None = None,
) -> tuple[list[Sample], dict[str, float]]:
    """``samples`` with each one's advantages scaled by its role's factor, and
    ``batch/role_weight/<role>`` stats of the factors (nothing when every factor is 1).

    A role's factor is its :func:`role_weights` with ``balance`` (else 1) times ``scale[role]``
    (``algorithm.role_scale``: a role's share of the update set by hand, 0 to not train it).
    """
    weights = role_weights(samples, trajectories, aggregation) if balance else {}
    present = {t.role_name for t in trajectories if t.role_name is not None}
    for role, factor in (scale or {}).items():
        if role in present:
            weights[role] = weights.get(role, 1.0) * factor
    if not weights:
        return list(samples), {}
    balanced = []
    for sample in samples:
        role = trajectories[sample.trajectory].role_name
        # 1 for a one-role env's sample, and for a role with no loss token (it adds nothing)
        w = 1.0 if role is None else weights.get(role, 1.0)
        per_token = sample.token_advantages
        balanced.append(
            replace(
                sample,
                advantage=sample.advantage * w,
                token_advantages=None if per_token is None else [a * w for a in per_token],
            )
        )
    return balanced, {f"batch/role_weight/{role}": w for role, w in sorted(weights.items())}


def check_role_scale(scale: Mapping[str, float], roles: Sequence[str]) -> None:
    """Refuse an ``algorithm.role_scale`` that names a role no env lets the policy play (a
    misspelt role would otherwise scale nothing, silently).

    Raises:
        ConfigError: The unknown names, the nearest role to each, and the roles there are.
    """
    import difflib

    unknown = [name for name in scale if name not in roles]
    if not unknown:
        return
    if not roles:
        raise ConfigError(
            f"algorithm.role_scale names {unknown}, but no env of the run has roles the policy "
            "plays (it applies to multi-role envs): remove it"
        )
    hints = [
        f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name)
        for name in unknown
        for close in [difflib.get_close_matches(name, roles, n=1)]
    ]
    raise ConfigError(
        f"algorithm.role_scale names no role the policy plays: {', '.join(hints)}; the envs' "
        f"roles are {sorted(set(roles))}"
    )
