"""The figures the README and the docs quote about a run, kept equal to what was measured.

``docs/figures.json`` is the recorded artifact: the quickstart's runs (per seed: the reward and
pass@1 of each step, the held-out reward at each evaluation, the wall time of ``envhub train``)
and the last fresh-clone CI run (install time, tests passed and skipped, the tests' time). Every
figure the docs quote is derived from it by :func:`derived` and written in the docs between markers,
``<!--fig KEY-->VALUE<!--/fig-->`` (invisible once rendered); ``tests/test_readme.py`` fails when
a marked value is not the artifact's. Three commands regenerate it (the quickstart on an
otherwise idle machine: its wall time is quoted):

    .venv/bin/python scripts/figures.py quickstart [--seeds 0 1 2]  # envhub train, ~4 min a seed
    .venv/bin/python scripts/figures.py tests CI_LOG                # the output of `.ci/run`
    .venv/bin/python scripts/figures.py write                       # the docs' marked values
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ARTIFACT = ROOT / "docs" / "figures.json"
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MARKED = re.compile(r"<!--fig ([a-z_]+\.[\w.]+)-->(.*?)<!--/fig-->")


def derived(artifact: dict[str, Any]) -> dict[str, str]:
    """Every quotable figure, by key, as the docs write it."""
    figures: dict[str, str] = {}
    runs = artifact.get("quickstart", {}).get("runs", [])
    if runs:
        figures |= _quickstart(runs, artifact["quickstart"].get("seed", 0))
    tests = artifact.get("tests")
    if tests:
        figures |= _tests(tests)
    if runs and tests:
        first_time = tests["install_s"] + _by_seed(runs, 0)["wall_s"]
        figures["quickstart.first_time_minutes"] = f"{first_time / 60:.1f}"
    return figures


def _by_seed(runs: list[dict[str, Any]], seed: int) -> dict[str, Any]:
    return next(r for r in runs if r["seed"] == seed)


def _quickstart(runs: list[dict[str, Any]], seed: int) -> dict[str, str]:
    run = _by_seed(runs, seed)
    # "The share of right answers": pass@1 (the reward adds a format bonus).
    rewards, evals = run["passes"], [value for _, value in run["evals"]]
    last_evals = [[value for _, value in r["evals"]][-1] for r in runs]
    seeds = [str(r["seed"]) for r in runs]
    listed = f"{', '.join(seeds[:-1])} and {seeds[-1]}" if len(seeds) > 1 else seeds[0]
    return {
        "quickstart.steps": str(len(rewards)),
        "quickstart.train_minutes": f"{run['wall_s'] / 60:.1f}",
        # pass@1 at the first step, and the mean of the last five (one step is noisy).
        "quickstart.reward_first": f"{rewards[0]:.2f}",
        "quickstart.reward_last": f"{sum(rewards[-5:]) / 5:.2f}",
        "quickstart.eval_first": f"{evals[0]:.1f}",
        "quickstart.eval_last": f"{evals[-1]:.2f}",
        "quickstart.eval_best": f"{max(evals):.2f}",
        "quickstart.seeds": listed,
        "quickstart.seeds_eval_range": f"{min(last_evals):.2f}-{max(last_evals):.2f}",
        "quickstart.seeds_eval_mean": f"{sum(last_evals) / len(last_evals):.2f}",
    }


def _tests(tests: dict[str, Any]) -> dict[str, str]:
    total = tests["passed"] + tests["skipped"]
    return {
        "tests.about": f"{round(total, -2):,}",
        "tests.passed": f"{tests['passed']:,}",
        "tests.skipped": f"{tests['skipped']:,}",
        "tests.minutes": f"{tests['tests_s'] / 60:.1f}",
        "tests.about_minutes": f"{round(tests['tests_s'] / 60):d}",
        "tests.total_minutes": f"{round((tests['tests_s'] + tests['install_s']) / 60):d}",
        "tests.install_minutes": f"{round(tests['install_s'] / 60):d}",
        "tests.date": tests["date"],
    }


def mismatches(docs: list[Path], figures: dict[str, str]) -> list[str]:
    """One line per marked value in ``docs`` that is not the artifact's (or has no key there)."""
    found = []
    for path in docs:
        for lineno, line in enumerate(path.read_text().splitlines(), start=1):
            for key, value in MARKED.findall(line):
                expected = figures.get(key)
                if value != expected:
                    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                    found.append(
                        f"{where}:{lineno}: {key} is {value!r}, the artifact says {expected!r}"
                    )
    return found


def write(docs: list[Path], figures: dict[str, str]) -> int:
    """Set every marked value in ``docs`` to the artifact's; how many changed."""
    unknown = [
        f"{path}: no figure {key!r} in {ARTIFACT.name}"
        for path in docs
        for key, _ in MARKED.findall(path.read_text())
        if key not in figures
    ]
    if unknown:
        raise SystemExit("\n".join(unknown))
    changed = 0
    for path in docs:
        text = path.read_text()
        new = MARKED.sub(lambda m: f"<!--fig {m[1]}-->{figures[m[1]]}<!--/fig-->", text)
        if new != text:
            before, after = MARKED.findall(text), MARKED.findall(new)
            changed += sum(a != b for a, b in zip(before, after, strict=True))
            path.write_text(new)
    return changed


def run_quickstart(seed: int, out: Path) -> dict[str, Any]:
    """``envhub train examples/quickstart.yaml seed=SEED``, timed; its rewards and evals."""
    command = [sys.executable, "-m", "envhub.cli", "train", str(QUICKSTART), f"seed={seed}",
               f"logging.output_dir={out}", f"logging.run_name=seed{seed}"]  # fmt: skip
    started = time.monotonic()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    wall = time.monotonic() - started
    rows = [json.loads(line) for line in (out / f"seed{seed}" / "metrics.jsonl").open()]
    return {
        "seed": seed,
        "wall_s": round(wall, 1),
        "rewards": [round(r["reward/mean"], 4) for r in rows if "reward/mean" in r],
        "passes": [round(r["pass@1"], 4) for r in rows if "pass@1" in r],
        "evals": [[r["step"], round(r["eval/reward"], 4)] for r in rows if "eval/reward" in r],
    }


def read_ci_log(text: str) -> dict[str, Any]:
    """What a ``bash .ci/run`` log says: the install's seconds and pytest's summary line."""
    install = re.search(r"install took (\d+) s", text)
    summary = re.findall(r"=+ (.*?) in ([\d.]+)s", text)
    if install is None or not summary:
        raise SystemExit("not a .ci/run log: no 'install took N s' line or no pytest summary")
    counts, seconds = summary[-1]
    number = {k: int(v) for v, k in re.findall(r"(\d+) (passed|skipped|failed|errors?)", counts)}
    if number.get("failed") or number.get("error") or number.get("errors"):
        raise SystemExit(f"the log's run did not pass: {counts}")
    return {
        "date": datetime.date.today().isoformat(),
        "install_s": int(install[1]),
        "passed": number.get("passed", 0),
        "skipped": number.get("skipped", 0),
        "tests_s": round(float(seconds), 1),
    }


def main() -> None:
    """The command line (see the module's docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    quick = commands.add_parser("quickstart", help="run the quickstart per seed and record it")
    quick.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    tests = commands.add_parser("tests", help="record a `bash .ci/run` log's figures")
    tests.add_argument("log", type=Path)
    commands.add_parser("write", help="set the docs' marked figures to the artifact's")
    commands.add_parser("check", help="list the docs' figures that are not the artifact's")
    args = parser.parse_args()
    artifact = json.loads(ARTIFACT.read_text()) if ARTIFACT.exists() else {}
    if args.command == "quickstart":
        with tempfile.TemporaryDirectory(prefix="envhub-figures-") as out:
            runs = {seed: run_quickstart(seed, Path(out)) for seed in args.seeds}
        # The seeds not run again keep their records (re-time seed 0 alone on an idle machine).
        kept = [r for r in artifact.get("quickstart", {}).get("runs", []) if r["seed"] not in runs]
        artifact["quickstart"] = {
            "seed": 0,
            "date": datetime.date.today().isoformat(),
            "runs": sorted([*kept, *runs.values()], key=lambda r: r["seed"]),
        }
    elif args.command == "tests":
        artifact["tests"] = read_ci_log(args.log.read_text())
    if args.command in ("quickstart", "tests"):
        ARTIFACT.write_text(json.dumps(artifact, indent=1) + "\n")
        print(f"recorded {args.command} in {ARTIFACT.relative_to(ROOT)}; now: figures.py write")
        return
    figures = derived(artifact)
    if args.command == "write":
        print(f"{write(DOCS, figures)} figure(s) changed")
        return
    wrong = mismatches(DOCS, figures)
    print("\n".join(wrong) or "every marked figure is the artifact's")
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
