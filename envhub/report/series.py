"""What a chart's series look like once drawn: none hidden under another, no axis made up.

Two series with the same points draw one line over the other, so a chart legend listed four
names and showed two lines (``train/loss`` exactly on ``train/policy_loss`` when nothing is added
to the policy's loss). Such series are drawn once, named ``"train/loss = train/policy_loss"``.

A chart whose every value is 0 got plotly's default range for a flat line, -1 to 1, which shows
room for negative values that cannot occur (a clip fraction, an error count); it gets a range
from just below 0 to 1 and the note ``all zero``.
"""

from __future__ import annotations

import math
from typing import Any

ZERO_RANGE = (-0.05, 1.0)
"""The y range of an all-zero chart: the line just above the x axis, not on it."""


def same_points(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """``a`` and ``b`` have the same steps and, at each, the same value (to float rounding)."""
    return a["x"] == b["x"] and all(
        math.isclose(u, v, rel_tol=1e-9, abs_tol=1e-12) for u, v in zip(a["y"], b["y"], strict=True)
    )


def merge_identical(series: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``series`` with each one that repeats an earlier one's points folded into it: drawn once,
    named by all its names joined with ``" = "`` (``names`` lists them), in first-seen order."""
    merged: list[dict[str, Any]] = []
    for one in series:
        twin = next((m for m in merged if same_points(m, one)), None)
        if twin is None:
            merged.append({**one, "names": [one["name"]]})
        else:
            twin["names"].append(one["name"])
            twin["name"] = " = ".join(twin["names"])
    return merged


def all_zero(series: list[dict[str, Any]]) -> bool:
    """Every value of every series is 0 (and there is at least one)."""
    values = [y for one in series for y in one["y"]]
    return bool(values) and all(y == 0 for y in values)


def shape_chart(chart: dict[str, Any]) -> dict[str, Any]:
    """``chart`` (``{title, yaxis, series}``) as drawn: identical series merged, and an all-zero
    chart given :data:`ZERO_RANGE` (``yrange``) and the note ``all zero`` (``note``)."""
    shaped = {**chart, "series": merge_identical(chart["series"])}
    if all_zero(shaped["series"]):
        shaped |= {"yrange": list(ZERO_RANGE), "note": "all zero"}
    return shaped
