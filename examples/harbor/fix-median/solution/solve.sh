#!/bin/bash
cat > /app/stats.py <<'PY'
"""Small statistics helpers."""


def median(values):
    """The middle value of `values` (the mean of the two middle ones for an even count)."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2
PY
