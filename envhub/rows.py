"""Dataset rows a :class:`~envhub.env.TaskEnv` needs: which fields, which rows lack them.

A row without the field a reward or the prompt reads would only fail (or quietly score 0)
when training draws it; :meth:`TaskEnv.required_fields` names the fields and the env checks
every row when it is made, naming the rows to fix.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from envhub.rewards.rubric import RewardFunction


@dataclass(frozen=True)
class RequiredField:
    """A field every dataset row of a :class:`TaskEnv` must have (present and not ``None``)."""

    names: tuple[str, ...]
    """The field's name, or alternatives of which one suffices (``("prompt", "question")``)."""
    reader: str
    """What needs it, for the error message: ``the reward `exact_match```, ``format_prompt``."""


def needs_argument(func: RewardFunction, name: str) -> bool:
    """True when ``func`` asks for ``name`` and has no default to fall back on."""
    if name not in func.params:
        return False
    parameter = inspect.signature(func.fn).parameters.get(name)
    return parameter is None or parameter.default is inspect.Parameter.empty


def _column(rows: Any, name: str) -> list[Any]:
    """The ``name`` field of every row (``None`` where it is missing)."""
    columns = getattr(rows, "column_names", None)
    if isinstance(columns, list) and hasattr(rows, "with_format"):
        # A datasets.Dataset: one Arrow column takes milliseconds, 100k rows one by one seconds.
        if name not in columns:
            return [None] * len(rows)
        return rows.with_format("arrow")[name].to_pylist()
    return [row.get(name) if isinstance(row, Mapping) else None for row in rows]


def rows_without(rows: Any, names: tuple[str, ...]) -> list[int]:
    """Indices of the rows that have none of ``names`` (or only ``None`` values for them)."""
    columns = [_column(rows, name) for name in names]
    return [
        i for i, values in enumerate(zip(*columns, strict=True)) if all(v is None for v in values)
    ]


def missing_message(env: str, need: RequiredField, missing: list[int], size: int) -> str:
    """``task 3 has no 'answer', ...``: the rows to fix (up to five) and what needs the field."""
    fields = " nor ".join(repr(name) for name in need.names)
    what = f"no {fields}" if len(need.names) == 1 else f"neither {fields}"
    if len(missing) == 1:
        return f"{env}: task {missing[0]} has {what}, needed by {need.reader}"
    shown = ", ".join(map(str, missing[:5])) + (
        f" and {len(missing) - 5} more" if len(missing) > 5 else ""
    )
    return f"{env}: tasks {shown} ({len(missing)} of {size}) have {what}, needed by {need.reader}"
