"""Summaries of a set of trajectories: what ``envhub eval`` prints and saves.

pass@k uses the unbiased estimator of Chen et al. (2021): with ``n`` samples of a task of which
``c`` pass, pass@k = 1 - C(n-c, k) / C(n, k), averaged over tasks.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

from envhub.types import OUTCOMES, Trajectory


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of ``k`` samples drawn from ``n`` (``c`` correct) passes."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def k_values(n: int) -> list[int]:
    """1, 2, 4, ... up to ``n``, and ``n`` itself."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return [*ks, n] if n >= 1 else []


class EvalSummary(BaseModel):
    """Aggregate results of an evaluation."""

    episodes: int
    tasks: int
    samples_per_task: int
    reward_mean: float
    reward_std: float
    components: dict[str, float] = Field(default_factory=dict)
    """Mean of each reward component (unweighted)."""
    pass_at: dict[int, float] = Field(default_factory=dict)
    pass_threshold: float
    tool_calls: float = 0.0
    tool_validity: float | None = None
    """Share of tool calls that parsed and ran without error (``None`` if there were none)."""
    tool_errors: dict[str, int] = Field(default_factory=dict)
    turns_mean: float = 0.0
    completion_tokens_mean: float = 0.0
    stop_reasons: dict[str, int] = Field(default_factory=dict)
    outcomes: dict[str, int] = Field(default_factory=dict)
    """Episodes per outcome (``Trajectory.outcome``), every outcome listed, in the order ok,
    policy_failure, env_failure, infra_failure, timeout."""
    episodes_with_errors: int = 0
    error_stages: dict[str, int] = Field(default_factory=dict)
    token_drift_episodes: int = 0
    seconds: float = 0.0
    extra: dict[str, Any] = Field(default_factory=dict)


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def _pass_at(trajectories: Sequence[Trajectory], threshold: float) -> dict[int, float]:
    by_task: dict[str, list[bool]] = defaultdict(list)
    for t in trajectories:
        by_task[t.group_id].append(t.reward >= threshold - 1e-9)
    sizes = {len(v) for v in by_task.values()}
    n = min(sizes) if sizes else 0
    return {k: _mean([pass_at_k(len(v), sum(v), k) for v in by_task.values()]) for k in k_values(n)}


def _tool_stats(trajectories: Sequence[Trajectory]) -> tuple[float, float | None, dict[str, int]]:
    calls = sum(t.metrics.get("tool_calls", 0.0) for t in trajectories)
    errors = sum(t.metrics.get("tool_errors", 0.0) for t in trajectories)
    kinds: Counter[str] = Counter()
    for t in trajectories:
        for key, value in t.metrics.items():
            if key.startswith("tool_error/"):
                kinds[key.removeprefix("tool_error/")] += int(value)
    validity = None if calls == 0 else (calls - errors) / calls
    return calls / max(len(trajectories), 1), validity, dict(kinds)


def _outcomes(trajectories: Sequence[Trajectory]) -> dict[str, int]:
    counts = Counter(t.outcome for t in trajectories)
    return {outcome: counts[outcome] for outcome in OUTCOMES}


def summarize(
    trajectories: Sequence[Trajectory], pass_threshold: float = 1.0, seconds: float = 0.0
) -> EvalSummary:
    """Aggregate ``trajectories`` (groups are told apart by ``group_id``)."""
    rewards = [t.reward for t in trajectories]
    names = sorted({name for t in trajectories for name in t.reward_components})
    groups = {t.group_id for t in trajectories}
    calls, validity, kinds = _tool_stats(trajectories)
    return EvalSummary(
        episodes=len(trajectories),
        tasks=len(groups),
        samples_per_task=len(trajectories) // max(len(groups), 1),
        reward_mean=_mean(rewards),
        reward_std=statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        components={
            n: _mean([t.reward_components[n] for t in trajectories if n in t.reward_components])
            for n in names
        },
        pass_at=_pass_at(trajectories, pass_threshold),
        pass_threshold=pass_threshold,
        tool_calls=calls,
        tool_validity=validity,
        tool_errors=kinds,
        turns_mean=_mean([len(t.turns) for t in trajectories]),
        completion_tokens_mean=_mean([t.num_completion_tokens for t in trajectories]),
        stop_reasons=dict(Counter(t.stop_reason for t in trajectories)),
        outcomes=_outcomes(trajectories),
        episodes_with_errors=sum(1 for t in trajectories if t.errors),
        error_stages=dict(Counter(e.stage for t in trajectories for e in t.errors)),
        token_drift_episodes=sum(1 for t in trajectories if t.token_drift),
        seconds=seconds,
    )
