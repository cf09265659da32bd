"""The reward audit's cost and hit rate: seconds per built-in env and per template (default 3
episodes a policy), and the share of the hackable fixture envs (tests/audit/hackable_envs.py)
flagged with their hack class, with their honest twins' passes.

Run from the repository root: ``python bench/audit.py`` (``--no-fixtures`` for the timing only).
Baseline, for comparison: the audit before issue 40 (6-8 policies, no reference mutants) took
0.01-2.9 s per built-in env on the same machine (calculator-agent 2.9 s, code 2.0 s, gsm8k 1.3 s,
code-fix 1.2 s, the others under 0.2 s).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import envhub  # noqa: E402
from envhub.audit import audit_env  # noqa: E402


def builtin_rows() -> list[tuple[str, float, bool, int]]:
    """(env, seconds, passed, policies) for every built-in env."""
    rows = []
    for name, spec in sorted(envhub.list_envs().items()):
        if spec.distribution != "envhub":
            continue
        with envhub.make(name) as env:
            start = time.perf_counter()
            report = audit_env(env, raise_on_failure=False)
            rows.append((name, time.perf_counter() - start, report.passed, len(report.policies)))
    return rows


def template_rows() -> list[tuple[str, float, bool, int]]:
    """(template, seconds, passed, policies) for every template, rendered to a temporary folder."""
    from envhub.package import package_env_specs
    from envhub.scaffold import TEMPLATES, create_package

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for template in TEMPLATES:
            path = create_package(f"bench-{template}", template, Path(tmp))
            sys.path.insert(0, str(path))
            for spec in package_env_specs(path).values():
                env = spec.load()()
                start = time.perf_counter()
                report = audit_env(env, raise_on_failure=False)
                seconds = time.perf_counter() - start
                rows.append((f"template {template}", seconds, report.passed, len(report.policies)))
    return rows


def fixture_rows() -> list[tuple[str, str, bool, bool, float]]:
    """(fixture, hack class, flagged with it, twin passed, seconds) for every hackable fixture."""
    spec = importlib.util.spec_from_file_location(
        "hackable_envs", ROOT / "tests" / "audit" / "hackable_envs.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = []
    for name, (make, hack) in module.HACKABLE.items():
        start = time.perf_counter()
        report = audit_env(make(), raise_on_failure=False)
        twin = audit_env(module.HONEST[name](), raise_on_failure=False)
        flagged = any(f.hack == hack for f in report.findings)
        rows.append((name, hack, flagged, twin.passed, time.perf_counter() - start))
    return rows


def main() -> None:
    """Print the timing table, then the fixtures' hit rate."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--no-fixtures", action="store_true", help="Time the envs only.")
    args = parser.parse_args()
    print(f"cores available: {len(os.sched_getaffinity(0))}")
    print(f"{'env':24} {'seconds':>8} {'passed':>7} {'policies':>9}")
    for name, seconds, passed, policies in builtin_rows() + template_rows():
        print(f"{name:24} {seconds:8.2f} {str(passed):>7} {policies:9d}")
    if args.no_fixtures:
        return
    rows = fixture_rows()
    print(f"\n{'fixture':24} {'class':20} {'flagged':>8} {'twin ok':>8} {'seconds':>8}")
    for name, hack, flagged, twin, seconds in rows:
        print(f"{name:24} {hack:20} {str(flagged):>8} {str(twin):>8} {seconds:8.2f}")
    hits = sum(r[2] for r in rows)
    twins = sum(r[3] for r in rows)
    print(f"\nhit rate {hits}/{len(rows)}; honest twins passing {twins}/{len(rows)}")


if __name__ == "__main__":
    main()
