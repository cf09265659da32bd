"""Soak the tool-call fuzz properties of ``tests/tools/test_fuzz.py`` with fresh random examples.

    .venv/bin/python bench/fuzz.py --minutes 5 --examples 500

The test suite runs those properties on a small deterministic sample; this runs each of them
again and again under the ``soak`` hypothesis profile (random, not derandomized; a failure
prints a blob that replays it) until the time is up, then prints how many examples each
property passed. Exit status 1 at the first failure, with hypothesis's report.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

FUZZ_FILE = Path(__file__).resolve().parent.parent / "tests" / "tools" / "test_fuzz.py"


def load_properties(examples: int) -> dict[str, Any]:
    """The hypothesis tests of the fuzz file, loaded under the ``soak`` profile."""
    os.environ["ENVHUB_FUZZ_PROFILE"] = "soak"
    os.environ["ENVHUB_FUZZ_EXAMPLES"] = str(examples)
    spec = importlib.util.spec_from_file_location("envhub_fuzz_soak", FUZZ_FILE)
    module: ModuleType = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {
        name: test
        for name, test in vars(module).items()
        if name.startswith("test_") and hasattr(test, "hypothesis")
    }


def count_examples(test: Any, counts: Counter[str], name: str) -> None:
    """Make ``test`` count each example it runs into ``counts[name]``."""
    inner = test.hypothesis.inner_test

    def counted(*args: Any, **kwargs: Any) -> Any:
        result = inner(*args, **kwargs)
        counts[name] += 1
        return result

    test.hypothesis.inner_test = counted


def main() -> int:
    """Run rounds of every property until ``--minutes`` have passed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="how long to soak")
    parser.add_argument("--examples", type=int, default=500, help="examples per property a round")
    args = parser.parse_args()
    properties, counts = load_properties(args.examples), Counter()
    for name, test in properties.items():
        count_examples(test, counts, name)
    start, rounds = time.monotonic(), 0
    while time.monotonic() - start < args.minutes * 60:
        for name, test in properties.items():
            print(f"round {rounds + 1}: {name}", flush=True)
            test()
        rounds += 1
    elapsed = time.monotonic() - start
    for name in properties:
        print(f"{counts[name]:>8} examples  {name}")
    print(f"{sum(counts.values())} examples passed in {rounds} rounds, {elapsed:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
