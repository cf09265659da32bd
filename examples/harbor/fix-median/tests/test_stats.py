"""Checks of /app/stats.py; prints the share that pass (the reward)."""

import sys

sys.path.insert(0, "/app")

CASES = [([3, 1, 2], 2), ([5], 5), ([4, 1, 3, 2], 2.5), ([10, 20], 15), ([1, 1, 2, 9], 1.5)]

try:
    from stats import median
except Exception:
    print(0.0)
    sys.exit(0)

passed = 0
for values, expected in CASES:
    try:
        passed += median(values) == expected
    except Exception:
        pass
print(passed / len(CASES))
