"""Time to `import envhub` (and what it pulls in), median of fresh interpreters.

.venv/bin/python bench/import_time.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys

SNIPPETS = {
    "python -c pass": "pass",
    "import envhub": "import envhub",
    "import envhub; envhub.make": "import envhub; envhub.make",
    "envhub.make('calculator')": "import envhub; envhub.make('calculator')",
}
PROBE = (
    "import sys, time; t = time.perf_counter(); {code}; print(time.perf_counter() - t); "
    "print(int(any(m in sys.modules for m in ('torch', 'transformers', 'vllm'))))"
)


def measure(code: str, runs: int = 15) -> tuple[float, bool]:
    """Time ``code`` in ``runs`` fresh interpreters.

    Returns:
        The median seconds ``code`` took (interpreter start-up excluded), and whether any run
        left torch, transformers or vllm in ``sys.modules``.
    """
    times, heavy = [], False
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-c", PROBE.format(code=code)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        times.append(float(out[0]))
        heavy |= out[1] == "1"
    return statistics.median(times), heavy


def main() -> None:
    """Print a table of median import times for each snippet in :data:`SNIPPETS`."""
    print(f"{'what':<32} {'median ms':>10}  torch/transformers/vllm loaded")
    for label, code in SNIPPETS.items():
        seconds, heavy = measure(code)
        print(f"{label:<32} {seconds * 1000:>10.1f}  {'yes' if heavy else 'no'}")


if __name__ == "__main__":
    main()
