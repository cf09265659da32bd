"""What the curriculum's parts share: how a task and a role are named, and a group's pass rate."""

from __future__ import annotations

from collections.abc import Sequence

TaskKey = tuple[int, str | None, int]
"""``(env index, level or None, task index)``: a task as the statistics know it."""
Role = str | None
"""A role of a multi-role env (``x``, ``solver``: seats together); ``None`` for a one-role env."""


def pass_rate(rewards: Sequence[float], threshold: float) -> float:
    """The share of ``rewards`` that reach ``threshold`` (a group's pass rate)."""
    return sum(r >= threshold - 1e-9 for r in rewards) / len(rewards) if rewards else 0.0


def key_order(key: TaskKey) -> tuple[int, str, int]:
    """A task key's place in a checkpoint (a level of ``None`` sorts first)."""
    env_index, level, task = key
    return (env_index, level or "", task)
