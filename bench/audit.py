"""The reward audit's cost and hit rate: seconds per built-in env and per template (default 3
episodes a policy), and the share of the hackable fixture envs (tests/audit/hackable_envs.py
and hackable_fields.py) flagged with their hack class, with their honest twins' passes.

Run from the repository root: ``python bench/audit.py`` (``--no-fixtures`` for the timing only,
``--only repo-repair`` for one built-in env).
The baseline, side by side: the policies the audit had before issue 40 (empty, echo,
junk-format, junk-tools, longest, numbers, everything and the env's cheats, judged against the
floor), played by the same runner on the same episodes: its seconds per env, and whether it
flags each fixture at all. ``--one-by-one`` adds a second baseline: the audit with every
episode verified and played one at a time (no verdict reused, no episode copies, as before the
speed-up of workspace envs), its seconds, and whether its findings are the same.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import envhub  # noqa: E402
from envhub.audit import audit_env, audit_floor, players, probes, run  # noqa: E402
from envhub.audit.run import TOLERANCE, _play  # noqa: E402
from envhub.checks.checker import _starts  # noqa: E402

OLD = ("empty", "echo", "junk-format", "junk-tools", "longest", "numbers", "everything")


def old_audit(env, seeds: tuple[int, ...] = (0, 1, 2)) -> tuple[float, bool]:
    """(seconds, flagged) for the policies of the audit before issue 40 (see the docstring)."""
    floor, _ = audit_floor(env)
    start = time.perf_counter()
    flagged = False
    for probe in probes(env):
        if probe.name in OLD or probe.name.startswith("cheat:"):
            for episode in _starts(env, seeds):
                found = _play(env, probe, episode, 100)
                reward = None if found is None else found.reward
                flagged |= found is not None and (reward is None or reward > floor + TOLERANCE)
    return time.perf_counter() - start, flagged


@contextlib.contextmanager
def one_by_one():
    """The audit with every episode verified and played one at a time."""
    saved = players.EPISODES_AT_ONCE, run._reusing_verdicts
    players.EPISODES_AT_ONCE = 1
    run._reusing_verdicts = lambda env: contextlib.nullcontext()
    try:
        yield
    finally:
        players.EPISODES_AT_ONCE, run._reusing_verdicts = saved


def timed_audit(env, seeds: tuple[int, ...]):
    """(seconds, report) of the audit of ``env``."""
    start = time.perf_counter()
    report = audit_env(env, seeds=seeds, raise_on_failure=False)
    return time.perf_counter() - start, report


def findings(report) -> list[tuple]:
    """What identifies each finding of ``report``."""
    return [(f.policy, f.seed, f.task, f.hack, f.reward, f.error) for f in report.findings]


def audit_row(label: str, env, seeds: tuple[int, ...], compare: bool) -> tuple:
    """(label, seconds, passed, policies, seconds of the old policies) and, with ``compare``,
    (seconds one by one, same findings one by one)."""
    seconds, report = timed_audit(env, seeds)
    row = (label, seconds, report.passed, len(report.policies), old_audit(env, seeds)[0])
    if not compare:
        return row
    with one_by_one():
        alone, again = timed_audit(env, seeds)
    return (*row, alone, findings(again) == findings(report))


def builtin_rows(compare: bool, only: list[str] | None = None) -> list[tuple]:
    """:func:`audit_row` for every built-in env (those named in ``only``, when given)."""
    rows = []
    for name, spec in sorted(envhub.list_envs().items()):
        if spec.distribution != "envhub" or (only and name not in only):
            continue
        with envhub.make(name) as env:
            rows.append(audit_row(name, env, (0, 1, 2), compare))
    return rows


def template_rows(compare: bool) -> list[tuple]:
    """:func:`audit_row` for every template, rendered to a temporary folder."""
    from envhub.package import package_env_specs
    from envhub.scaffold import TEMPLATES, create_package

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for template in TEMPLATES:
            path = create_package(f"bench-{template}", template, Path(tmp))
            sys.path.insert(0, str(path))
            for spec in package_env_specs(path).values():
                rows.append(audit_row(f"template {template}", spec.load()(), (0, 1, 2), compare))
    return rows


VARIANTS = {
    "guess-number progress": ("guess-number", {"progress_reward": 0.2}),
    "guess-number 1..1000": ("guess-number", {"low": 1, "high": 1000}),
    "calculator tool pay": ("calculator", {"tool_call_reward": 0.1}),
    "frozenlake 8 slippery": ("frozenlake", {"size": 8, "is_slippery": True}),
    "frozenlake 5": ("frozenlake", {"size": 5}),
    "arithmetic 200": ("arithmetic", {"num_tasks": 200}),
    "wordle 5 turns": ("wordle", {"max_turns": 5}),
}
"""Built-in envs with other settings, audited on 5 episodes: more chances for a false alarm."""


def variant_rows(compare: bool) -> list[tuple]:
    """:func:`audit_row` for :data:`VARIANTS`."""
    rows = []
    for label, (name, kwargs) in VARIANTS.items():
        with envhub.make(name, **kwargs) as env:
            rows.append(audit_row(label, env, (0, 1, 2, 3, 4), compare))
    return rows


FIXTURES = ("hackable_envs", "hackable_fields")
"""The modules of tests/audit/ that hold hackable fixtures (``HACKABLE`` and ``HONEST``)."""


def fixture_rows() -> list[tuple[str, str, bool, bool, float, bool]]:
    """(fixture, hack class, flagged with it, twin passed, seconds, flagged by the old policies)
    for every hackable fixture."""
    rows = []
    for name in FIXTURES:
        path = ROOT / "tests" / "audit" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        rows += _fixture_rows(module)
    return rows


def _fixture_rows(module) -> list[tuple[str, str, bool, bool, float, bool]]:
    """:func:`fixture_rows` for the fixtures of one module."""
    rows = []
    for name, (make, hack) in module.HACKABLE.items():
        start = time.perf_counter()
        report = audit_env(make(), raise_on_failure=False)
        twin = audit_env(module.HONEST[name](), raise_on_failure=False)
        flagged = any(f.hack == hack for f in report.findings)
        seconds = time.perf_counter() - start
        rows.append((name, hack, flagged, twin.passed, seconds, old_audit(make())[1]))
    return rows


def main() -> None:
    """Print the timing table, then the fixtures' hit rate."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--no-fixtures", action="store_true", help="Time the envs only.")
    parser.add_argument(
        "--one-by-one", action="store_true", help="Also time each env one episode at a time."
    )
    parser.add_argument("--only", nargs="*", help="Only these built-in envs (no templates).")
    args = parser.parse_args()
    compare = args.one_by_one
    print(f"cores available: {len(os.sched_getaffinity(0))}")
    extra = f" {'1-by-1 s':>9} {'same':>5}" if compare else ""
    print(f"{'env':24} {'seconds':>8} {'passed':>7} {'policies':>9} {'old s':>7}{extra}")
    rows = builtin_rows(compare, args.only)
    if not args.only:
        rows += template_rows(compare) + variant_rows(compare)
    for name, seconds, passed, policies, old, *alone in rows:
        line = f"{name:24} {seconds:8.2f} {str(passed):>7} {policies:9d} {old:7.2f}"
        if alone:
            line += f" {alone[0]:9.2f} {str(alone[1]):>5}"
        print(line)
    if args.no_fixtures or args.only:
        return
    rows = fixture_rows()
    head = f"{'fixture':24} {'class':20} {'flagged':>8} {'twin ok':>8} {'seconds':>8} {'old':>6}"
    print(f"\n{head}")
    for name, hack, flagged, twin, seconds, old in rows:
        print(f"{name:24} {hack:20} {str(flagged):>8} {str(twin):>8} {seconds:8.2f} {str(old):>6}")
    hits, twins, old = (sum(r[i] for r in rows) for i in (2, 3, 5))
    print(
        f"\nhit rate {hits}/{len(rows)} (old policies: {old}/{len(rows)}, any class); "
        f"honest twins passing {twins}/{len(rows)}"
    )


if __name__ == "__main__":
    main()
