"""Warm starts and distillation against RL alone, on 2 CPU cores, SmolLM2-135M-Instruct.

Four measurements, each over ``--seeds`` (default 0 1 2), printed side by side:

    cold-start     `calculator` without the worked example or the call bonus: RL alone for 5
                   steps vs examples/calculator-warmstart.yaml (64 reference-policy
                   demonstrations, then RL). Episodes with a call that runs (the last RL step's
                   and the held-out's), held-out problems solved (greedy), wall time.
    quickstart     examples/quickstart.yaml as shipped: held-out reward at step 20, its best
                   and the fall from the best to the last; the teacher of `distill`.
    distill        the base model distilled from the quickstart's seed-0 model (a local teacher,
                   the teacher alone: no reward) vs the quickstart's RL from scratch: held-out
                   reward against steps and wall time.
    self-distill   `calculator`: the policy shown the worked example teaches itself without it
                   (``distill.teacher: {kind: self, env_args: {demonstration: true}}``).

Every run is a real ``envhub train`` of a shipped config with overrides; the numbers come from
its ``metrics.jsonl`` and ``trajectories/``. A full pass takes about 1.5 hours on 2 cores:

    .venv/bin/python bench/beyond_rl.py cold-start quickstart distill self-distill \
        [--seeds 0 1 2] [--out bench-out/] [--json results.json] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from envhub.rollout.io import iter_trajectories
from envhub.trainer.config import load_config
from envhub.trainer.loop import train

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
CALCULATOR = {"max_turns": 3}
COMMON = ["checkpoint.every=1000", "logging.plot=false", "checkpoint.resume=never"]
WARM_ONLY = False
"""``--warm-only``: the cold start without its RL-alone baseline."""
EXTRA: list[str] = []
"""``--set KEY=VALUE`` overrides, applied to every run after the measurement's own."""


def run(config: str, out: Path, name: str, overrides: list[str]) -> dict[str, Any]:
    """One training run of ``examples/<config>.yaml``: its metric rows, folder and wall time."""
    cfg = load_config(
        EXAMPLES / f"{config}.yaml",
        [*COMMON, f"logging.output_dir={out}", f"logging.run_name={name}", *overrides, *EXTRA],
    )
    started = time.perf_counter()
    result = train(cfg)
    seconds = time.perf_counter() - started
    return {"rows": result.history, "dir": result.run_dir, "seconds": seconds,
            "final": result.final_model}  # fmt: skip


def calls_that_run(folder: Path) -> float:
    """The share of a step's (or an eval's) episodes in which at least one tool call ran."""
    episodes = list(iter_trajectories(folder))
    ran = [t for t in episodes if t.metrics.get("tool_calls", 0) > t.metrics.get("tool_errors", 0)]
    return len(ran) / max(len(episodes), 1)


def last_step_file(run_dir: Path) -> Path:
    """The run's last training step's episodes."""
    return sorted((run_dir / "trajectories").glob("step-*.jsonl"))[-1]


def last_eval_file(run_dir: Path) -> Path:
    """The run's last held-out evaluation's episodes."""
    return sorted((run_dir / "trajectories" / "eval").glob("step-*.jsonl"))[-1]


def evals(rows: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    """``(step, value)`` of every row that logged ``key``."""
    return [(r["step"], r[key]) for r in rows if key in r]


# -- the measurements --------------------------------------------------------------------------


def cold_start(seed: int, out: Path) -> dict[str, Any]:
    """RL alone (unless ``--warm-only``) vs warm start then RL on the plain calculator."""
    plain_env = f"envs=[{{name: calculator, args: {json.dumps(CALCULATOR)}}}]"
    runs = {}
    if not WARM_ONLY:
        runs["rl_alone"] = run("calculator-warmstart", out, f"rl-alone-{seed}", [
            f"seed={seed}", "sft=null", "steps=5", plain_env, "eval.every=null",
        ])  # fmt: skip
    runs["warm_start"] = run("calculator-warmstart", out, f"warm-start-{seed}", [f"seed={seed}"])
    result = {}
    for label, r in runs.items():
        held = evals(r["rows"], "eval/held-out/pass@1")
        result[label] = {
            "seconds": r["seconds"],
            "calls_last_step": calls_that_run(last_step_file(r["dir"])),
            "calls_held_out": calls_that_run(last_eval_file(r["dir"])),
            "held_out_solved": [(step, round(v * 16)) for step, v in held],
        }
    return result


def quickstart(seed: int, out: Path) -> dict[str, Any]:
    """The shipped quickstart: held-out reward per evaluation."""
    r = run("quickstart", out, f"quickstart-{seed}", [f"seed={seed}"])
    held = evals(r["rows"], "eval/two-digit/reward")
    best = max(v for _, v in held)
    return {"seconds": r["seconds"], "held_out": held, "last": held[-1][1], "best": best,
            "fall": best - held[-1][1], "final": str(r["final"]),
            "step_seconds": [row.get("time/step", 0.0) for row in r["rows"]]}  # fmt: skip


def distill(seed: int, out: Path, teacher: Path, steps: int) -> dict[str, Any]:
    """The base model taught by ``teacher`` alone (no reward), evaluated every step."""
    r = run("quickstart", out, f"distill-{seed}", [
        f"seed={seed}", f"steps={steps}", "eval.every=1", "algorithm.dynamic_sampling=false",
        "rollout.temperature=1.0",
        f"distill={{teacher: {{kind: local, model: {teacher}}}, reward_weight: 0.0}}",
    ])  # fmt: skip
    held = evals(r["rows"], "eval/two-digit/reward")
    return {"seconds": r["seconds"], "held_out": held,
            "step_seconds": [row.get("time/step", 0.0) for row in r["rows"]]}  # fmt: skip


def self_distill(seed: int, out: Path) -> dict[str, Any]:
    """The calculator policy shown the worked example teaching itself without it."""
    r = run("calculator-warmstart", out, f"self-distill-{seed}", [
        f"seed={seed}", "sft=null", "steps=5", "eval.every=null",
        "algorithm.dynamic_sampling=false",
        "distill={teacher: {kind: self, env_args: {demonstration: true}}, reward_weight: 1.0}",
    ])  # fmt: skip
    held = evals(r["rows"], "eval/held-out/pass@1")
    return {
        "seconds": r["seconds"],
        "calls_per_step": [
            calls_that_run(f) for f in sorted((r["dir"] / "trajectories").glob("step-*.jsonl"))
        ],
        "calls_held_out": calls_that_run(last_eval_file(r["dir"])),
        "held_out_solved": [(step, round(v * 16)) for step, v in held],
        "reverse_kl": [row.get("distill/reverse_kl") for row in r["rows"]],
    }


# -- the report --------------------------------------------------------------------------------


def spread(values: list[float]) -> str:
    """``mean (min, max)``."""
    mean = statistics.mean(values)
    low, high = min(values), max(values)
    return f"{mean:.3f} (min {low:.3f}, max {high:.3f})"


def report(results: dict[str, dict[int, Any]]) -> None:
    """Print every measurement's numbers, seeds side by side."""
    if "cold-start" in results:
        print("\ncold start (calculator, no worked example, no call bonus)")
        for label in ("rl_alone", "warm_start"):
            per_seed = [r[label] for r in results["cold-start"].values() if label in r]
            if not per_seed:
                continue
            print(f"  {label:11s} calls that run, last RL step: "
                  f"{spread([r['calls_last_step'] for r in per_seed])}; held-out episodes: "
                  f"{spread([r['calls_held_out'] for r in per_seed])}")  # fmt: skip
            print(f"  {'':11s} held-out solved of 16 (step, n): "
                  f"{[r['held_out_solved'] for r in per_seed]}; minutes: "
                  f"{[round(r['seconds'] / 60, 1) for r in per_seed]}")  # fmt: skip
    if "quickstart" in results:
        per_seed = list(results["quickstart"].values())
        print("\nquickstart (held-out two-digit reward)")
        print(f"  at step 20: {spread([r['last'] for r in per_seed])}; best: "
              f"{spread([r['best'] for r in per_seed])}; fall best -> last: "
              f"{spread([r['fall'] for r in per_seed])}")  # fmt: skip
        for seed, r in results["quickstart"].items():
            print(f"  seed {seed}: {r['held_out']} in {r['seconds'] / 60:.1f} min")
    if "distill" in results:
        print("\ndistillation from the quickstart's seed-0 model (teacher alone) vs RL")
        for seed, r in results["distill"].items():
            print(f"  seed {seed}: {r['held_out']} in {r['seconds'] / 60:.1f} min")
    if "self-distill" in results:
        print("\nself-distillation on calculator (teacher shown the worked example)")
        for seed, r in results["self-distill"].items():
            calls = [round(c, 2) for c in r["calls_per_step"]]
            print(f"  seed {seed}: calls that run per step {calls}, held-out episodes "
                  f"{r['calls_held_out']:.2f}, solved {r['held_out_solved']}, "
                  f"{r['seconds'] / 60:.1f} min")  # fmt: skip


def main() -> None:
    """Run the measurements asked for, then print them."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    choices = ["cold-start", "quickstart", "distill", "self-distill"]
    parser.add_argument("what", nargs="+", choices=choices)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path("bench-out/beyond-rl"))
    parser.add_argument("--teacher", type=Path, help="default: the quickstart's seed-0 model")
    parser.add_argument("--distill-steps", type=int, default=6)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="a run-config override for every run (e.g. optimizer.lr=1e-5)",
    )  # fmt: skip
    parser.add_argument("--warm-only", action="store_true", help="cold-start: no RL alone")
    args = parser.parse_args()
    EXTRA.extend(args.set)
    global WARM_ONLY
    WARM_ONLY = args.warm_only
    results: dict[str, dict[int, Any]] = {}
    measures: dict[str, Callable[[int, Path], dict[str, Any]]] = {
        "cold-start": cold_start,
        "quickstart": quickstart,
        "self-distill": self_distill,
    }
    for what in args.what:
        results[what] = {}
        for seed in args.seeds:
            if what == "distill":
                teacher = args.teacher or args.out / "quickstart-0" / "final"
                results[what][seed] = distill(seed, args.out, teacher, args.distill_steps)
            else:
                results[what][seed] = measures[what](seed, args.out)
            if args.json:
                args.json.write_text(json.dumps(results, indent=1, default=str))
    report(results)


if __name__ == "__main__":
    main()
