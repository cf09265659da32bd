"""Checks of /app/stats.py; prints the reward: the share of even-length cases it gets right,
or 0 if it breaks an odd-length case (which the buggy version already gets right)."""

import sys

sys.path.insert(0, "/app")

ODD = [([3, 1, 2], 2), ([5], 5), ([9, 1, 5, 7, 3], 5)]
EVEN = [([4, 1, 3, 2], 2.5), ([10, 20], 15), ([1, 1, 2, 9], 1.5), ([7, 3], 5)]


def right(median, values, expected):
    """Whether ``median`` gives ``expected`` for ``values`` (raising counts as wrong)."""
    try:
        return median(list(values)) == expected
    except Exception:
        return False


try:
    from stats import median
except Exception:
    print(0.0)
    sys.exit(0)

if not all(right(median, v, e) for v, e in ODD):
    print(0.0)
else:
    print(sum(right(median, v, e) for v, e in EVEN) / len(EVEN))
