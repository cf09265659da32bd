"""Evaluating a policy on an env: the episodes (:func:`evaluate`) and what they add up to
(:func:`summarize`).

:func:`evaluate` is the one entry point that plays an env's tasks against an inference engine
and summarises them: ``envhub eval`` calls it with an OpenAI-compatible server, the trainer's
held-out evaluation with the run's own engine, and a script with whatever engine it has::

    engine = envhub.OpenAIEngine("http://127.0.0.1:8000/v1", "my-model")
    result = asyncio.run(evaluate(engine, "arithmetic", range(20), samples_per_task=4))
    result.summary.pass_at[4]

pass@k uses the unbiased estimator of Chen et al. (2021): with ``n`` samples of a task of which
``c`` pass, pass@k = 1 - C(n-c, k) / C(n, k), averaged over tasks. When the tasks are named (a
Harbor task's row names it: ``info["name"]``, recorded as the trajectory's ``info["task"]``),
the summary also holds each task's own row (:attr:`EvalSummary.per_task`).
"""

from __future__ import annotations

import math
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from envhub.defaults import EPISODE_TIMEOUT_S, STEP_TIMEOUT_S
from envhub.types import OUTCOMES, Trajectory

if TYPE_CHECKING:
    from envhub.env import Env
    from envhub.inference.base import InferenceEngine, SamplingParams


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
    """Aggregate results of an evaluation.

    ``episodes`` counts episodes: one of a multi-role env, which records one trajectory per
    actor the policy played (two for tic-tac-toe self-play, ``k + 1`` for setter-solver with
    ``k`` solvers), counts once, and ``trajectories`` says how many records they made. The
    fields that average or count per record (reward, outcomes, turns, tool calls, errors)
    are over trajectories, which for a one-role env are the episodes.
    """

    episodes: int
    tasks: int
    samples_per_task: int
    trajectories: int = 0
    """Trajectories recorded (``episodes`` for a one-role env; 0 in a summary saved before it
    was counted)."""
    reward_mean: float
    reward_std: float
    components: dict[str, float] = Field(default_factory=dict)
    """Mean of each reward component (unweighted)."""
    pass_at: dict[int, float] = Field(default_factory=dict)
    pass_threshold: float
    tool_calls: float = 0.0
    """Tool calls per episode."""
    tool_calls_total: int = 0
    """Tool calls over all episodes, each one counted (valid or not)."""
    episodes_with_tool_calls: int = 0
    tool_validity: float | None = None
    """Share of all the episodes' tool calls that parsed, named an offered tool and ran without
    error, pooled over calls (``None`` if there were none). Not the mean of a per-episode
    ``tool_validity`` reward component (:func:`envhub.rewards.format.tool_call_validity`),
    which scores an episode without calls 1.0."""
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
    roles: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Per role of a multi-role env (solver seats together): ``trajectories`` (that role's),
    ``reward_mean``, ``results`` (trajectories per result: ``win``, ``solved``, ...) and
    ``pass_at`` (per task, over that role's trajectories of it); empty for one-role envs."""
    per_task: list[dict[str, Any]] = Field(default_factory=list)
    """One row per task played, in task order, when every episode's task is named (a Harbor
    task's): ``task`` (its name), ``task_index``, ``episodes``, ``reward_mean`` and ``pass_at``
    (over that task's samples); empty for tasks without names."""
    extra: dict[str, Any] = Field(default_factory=dict)


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else 0.0


TaskRole = tuple[str, str | None]
"""``(group id, role)``: a task's samples of one role (``None``: a one-role env's)."""


def _passes(trajectories: Sequence[Trajectory], threshold: float) -> dict[TaskRole, list[bool]]:
    """Whether each trajectory passed, per task and role: a role's seats together (the
    ``k`` solvers of each of a task's ``n`` episodes are that task's ``n * k`` solver samples)."""
    by_task: dict[TaskRole, list[bool]] = defaultdict(list)
    for t in trajectories:
        by_task[(t.group_id, t.role_name)].append(t.reward >= threshold - 1e-9)
    return by_task


def _pass_at(by_task: dict[TaskRole, list[bool]]) -> dict[int, float]:
    """pass@k averaged over the tasks (and roles), for k up to the fewest samples any has."""
    sizes = {len(v) for v in by_task.values()}
    n = min(sizes) if sizes else 0
    return {k: _mean([pass_at_k(len(v), sum(v), k) for v in by_task.values()]) for k in k_values(n)}


def episode_key(trajectory: Trajectory) -> tuple[Any, ...]:
    """What the trajectories of one episode share (its env, group, task, sample and seed): a
    multi-role episode records one trajectory per actor, all with this key."""
    t = trajectory
    return (t.env.name, t.group_id, t.task_index, t.sample_index, t.seed)


def count_episodes(trajectories: Sequence[Trajectory]) -> int:
    """Episodes the trajectories come from: each one-role trajectory is one; a multi-role
    episode's trajectories (one per actor) share their :func:`episode_key`."""
    solo = sum(1 for t in trajectories if t.role is None)
    return solo + len({episode_key(t) for t in trajectories if t.role is not None})


def _tool_stats(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    """The summary's tool-call fields: calls pooled over every episode."""
    calls = sum(t.metrics.get("tool_calls", 0.0) for t in trajectories)
    errors = sum(t.metrics.get("tool_errors", 0.0) for t in trajectories)
    kinds: Counter[str] = Counter()
    for t in trajectories:
        for key, value in t.metrics.items():
            if key.startswith("tool_error/"):
                kinds[key.removeprefix("tool_error/")] += int(value)
    return {
        "tool_calls": calls / max(len(trajectories), 1),
        "tool_calls_total": int(calls),
        "episodes_with_tool_calls": sum(1 for t in trajectories if t.metrics.get("tool_calls")),
        "tool_validity": None if calls == 0 else (calls - errors) / calls,
        "tool_errors": dict(kinds),
    }


def _outcomes(trajectories: Sequence[Trajectory]) -> dict[str, int]:
    counts = Counter(t.outcome for t in trajectories)
    return {outcome: counts[outcome] for outcome in OUTCOMES}


def _roles(
    trajectories: Sequence[Trajectory], passes: dict[TaskRole, list[bool]]
) -> dict[str, dict[str, Any]]:
    by_role: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        if t.role_name is not None:
            by_role[t.role_name].append(t)
    return {
        role: {
            "trajectories": len(ts),
            "reward_mean": _mean([t.reward for t in ts]),
            "results": dict(Counter(str(t.info.get("role_result")) for t in ts)),
            "pass_at": _pass_at({key: v for key, v in passes.items() if key[1] == role}),
        }
        for role, ts in sorted(by_role.items())
    }


def _per_task(
    trajectories: Sequence[Trajectory], passes: dict[TaskRole, list[bool]]
) -> list[dict[str, Any]]:
    """Each named task's row (see :attr:`EvalSummary.per_task`); none unless all are named."""
    if not all(isinstance(t.info.get("task"), str) for t in trajectories):
        return []
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t in sorted(trajectories, key=lambda t: t.task_index):
        groups[t.group_id].append(t)
    return [
        {
            "task": ts[0].info["task"],
            "task_index": ts[0].task_index,
            "episodes": count_episodes(ts),
            "reward_mean": _mean([t.reward for t in ts]),
            "pass_at": _pass_at({key: v for key, v in passes.items() if key[0] == group}),
        }
        for group, ts in groups.items()
    ]


def summarize(
    trajectories: Sequence[Trajectory], pass_threshold: float = 1.0, seconds: float = 0.0
) -> EvalSummary:
    """Aggregate ``trajectories`` (groups are told apart by ``group_id``)."""
    rewards = [t.reward for t in trajectories]
    names = sorted({name for t in trajectories for name in t.reward_components})
    groups = {t.group_id for t in trajectories}
    episodes = count_episodes(trajectories)
    passes = _passes(trajectories, pass_threshold)
    return EvalSummary(
        episodes=episodes,
        tasks=len(groups),
        samples_per_task=episodes // max(len(groups), 1),
        trajectories=len(trajectories),
        reward_mean=_mean(rewards),
        reward_std=statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        components={
            n: _mean([t.reward_components[n] for t in trajectories if n in t.reward_components])
            for n in names
        },
        pass_at=_pass_at(passes),
        pass_threshold=pass_threshold,
        **_tool_stats(trajectories),
        turns_mean=_mean([len(t.turns) for t in trajectories]),
        completion_tokens_mean=_mean([t.num_completion_tokens for t in trajectories]),
        stop_reasons=dict(Counter(t.stop_reason for t in trajectories)),
        outcomes=_outcomes(trajectories),
        episodes_with_errors=sum(1 for t in trajectories if t.errors),
        error_stages=dict(Counter(e.stage for t in trajectories for e in t.errors)),
        token_drift_episodes=sum(1 for t in trajectories if t.token_drift),
        seconds=seconds,
        roles=_roles(trajectories, passes),
        per_task=_per_task(trajectories, passes),
    )


@dataclass(frozen=True)
class Evaluation:
    """What :func:`evaluate` played, and its summary."""

    trajectories: list[Trajectory]
    """Every episode, in task then sample order."""
    summary: EvalSummary
    """Their summary; ``seconds`` is the rollouts' wall time."""


async def evaluate(
    engine: InferenceEngine,
    env: str | Callable[[], Env],
    tasks: Iterable[int],
    *,
    env_args: Mapping[str, Any] | None = None,
    samples_per_task: int = 1,
    sampling: SamplingParams | None = None,
    max_concurrency: int = 32,
    step_timeout: float | None = STEP_TIMEOUT_S,
    episode_timeout: float | None = EPISODE_TIMEOUT_S,
    seed: int = 0,
    pass_threshold: float | None = None,
    on_trajectory: Callable[[Trajectory], None] | None = None,
) -> Evaluation:
    """Play ``tasks`` of ``env`` against ``engine`` and summarise the episodes.

    The rollout runner records every episode as training would (token ids when the engine
    gives them, tool calls, reward components, outcomes); a failed episode is recorded, not
    raised. The engine is started if it is not yet, and left running: its owner closes it.

    Args:
        engine: What generates the assistant turns.
        env: A registered env's name (made with ``env_args``), or a factory of envs.
        tasks: Task indices of the env's dataset, each played ``samples_per_task`` times.
        env_args: Keyword arguments for ``envhub.make`` when ``env`` is a name.
        samples_per_task: Episodes per task (pass@k for k up to this).
        sampling: Temperature, top-p, max tokens per turn (default: the engine's defaults).
        max_concurrency: Episodes in flight at once.
        step_timeout: Seconds an env step may take.
        episode_timeout: Seconds an episode may take.
        seed: Seeds the task's episodes (the same seed plays the same episodes).
        pass_threshold: The reward that counts as a pass; default: the env's own.
        on_trajectory: Called with each episode as its group finishes (progress, streaming).
    """
    from envhub.rollout.runner import RolloutRunner

    factory = _env_factory(env, env_args or {})
    if pass_threshold is None:
        with factory() as probe:
            pass_threshold = float(getattr(probe, "pass_threshold", 1.0))
    runner = RolloutRunner(
        engine, factory, sampling=sampling, max_concurrency=max_concurrency,
        step_timeout=step_timeout, episode_timeout=episode_timeout, seed=seed,
    )  # fmt: skip
    started = time.perf_counter()
    trajectories = await runner.run(list(tasks), samples_per_task, on_trajectory=on_trajectory)
    seconds = time.perf_counter() - started
    return Evaluation(trajectories, summarize(trajectories, pass_threshold, seconds=seconds))


def _env_factory(env: str | Callable[[], Env], env_args: Mapping[str, Any]) -> Callable[[], Env]:
    """``env`` as a factory of fresh envs."""
    if not isinstance(env, str):
        if env_args:
            from envhub.errors import ConfigError

            raise ConfigError("env_args go with an env name; a factory takes its own arguments")
        return env
    from envhub.loader import make

    name, args = env, dict(env_args)
    return lambda: make(name, **args)
