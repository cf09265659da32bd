"""Evaluating a policy on an env, and what is measured around it.

- :mod:`envhub.evaluation.run` — :func:`evaluate` and :func:`summarize`: the episodes and what
  they add up to (pass@k, rewards, outcomes, per task);
- :mod:`envhub.evaluation.perf` — an env's performance card (its own cost per step and reset);
- :mod:`envhub.evaluation.rescore` — ``envhub rescore``: saved episodes scored again.

The names of :mod:`~envhub.evaluation.run` are importable from here.
"""

from envhub.evaluation.run import (
    EvalSummary,
    Evaluation,
    count_episodes,
    episode_key,
    evaluate,
    k_values,
    pass_at_k,
    summarize,
)

__all__ = [
    "EvalSummary",
    "Evaluation",
    "count_episodes",
    "episode_key",
    "evaluate",
    "k_values",
    "pass_at_k",
    "summarize",
]
