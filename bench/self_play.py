"""The setter/solver env trained with SmolLM2 on the CPU: does the setter's problems' solve rate
track the band it is rewarded for, and does the solver get better at held-out arithmetic?

One policy plays both roles of ``setter-solver`` (``envhub/envs/setter_solver.py``): per task,
``--samples`` setters each write a problem, and ``--attempts`` solvers try each valid one. The
run is ``examples/quickstart.yaml`` (SmolLM2-135M-Instruct, GRPO, the hf engine on the CPU)
with that env in place of arithmetic and ``--max-tokens`` per turn (the setter needs room for
``<problem>...</problem>``). Each step prints, over the step's setters: how many problems were
posed, the share that was invalid, the mean solve rate of the valid ones, and the share whose
solve rate fell inside the rewarded band, beside the band itself; then the mean reward per role
and the groups whose rewards all tied (nothing to learn; the run goes on through steps where
every group ties, ``algorithm.max_empty_steps: null``, since the whole curve is the measurement).
The held-out eval is the quickstart's (two-digit arithmetic, greedy, the solver's prompt), before
the first step and after the last.

Short by default (a smoke run of a few minutes on 2 cores); a long run is the issue's
measurement:

    .venv/bin/python bench/self_play.py                 # 3 steps, 8 held-out tasks
    .venv/bin/python bench/self_play.py --steps 40 --eval-tasks 32 [--json out.json] [--out runs/]

``--nudge`` pays a setter whose problem fell outside the band up to that much for a problem
whose size lies toward the band (``setter-solver``'s ``nudge``), so that two setters of a task
whose problems both missed the band on the same side no longer tie. ``--solver student`` trains
the setter alone against the env's fixed ``student`` solver, whose skill does not move (right
half the time at problem size 0.4): whether the setter finds the band at all, apart from a
solver that learns beside it. The ``size`` column is the valid problems' mean ``problem_size``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import envhub
from envhub.envs.setter_solver import DEFAULT_BAND, SetterSolverEnv
from envhub.rollout.io import read_trajectories
from envhub.trainer.config import load_config
from envhub.trainer.loop import train
from envhub.types import Trajectory

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"


def step_row(trajectories: list[Trajectory], band: tuple[float, float]) -> dict[str, float]:
    """What the step's setters posed and how the solvers did on it."""
    setters = [t for t in trajectories if t.role == "setter"]
    valid = [t for t in setters if t.metrics.get("invalid") == 0.0]
    rates = [t.metrics["solve_rate"] for t in valid if "solve_rate" in t.metrics]
    sizes = [t.metrics["problem_size"] for t in valid if "problem_size" in t.metrics]
    solvers = [t for t in trajectories if t.role_name == "solver"]
    return {
        "problems": float(len(setters)),
        "invalid_share": 1 - len(valid) / len(setters) if setters else float("nan"),
        "solve_rate": statistics.fmean(rates) if rates else float("nan"),
        "size": statistics.fmean(sizes) if sizes else float("nan"),
        "in_band_share": (
            sum(band[0] <= r <= band[1] for r in rates) / len(rates) if rates else float("nan")
        ),
        "setter_reward": statistics.fmean(t.reward for t in setters) if setters else float("nan"),
        "solver_reward": statistics.fmean(t.reward for t in solvers) if solvers else float("nan"),
    }


def run(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """The training run; its per-step rows and the held-out reward before and after."""
    env_args: dict[str, Any] = {"attempts": args.attempts, "nudge": args.nudge}
    if args.solver:
        env_args["policies"] = {"solver": args.solver}
    env = {"name": "setter-solver", "args": env_args}
    overrides = [
        f"steps={args.steps}",
        f"seed={args.seed}",
        f"envs={json.dumps([env])}",
        f"rollout.tasks_per_step={args.tasks}",
        f"rollout.samples_per_task={args.samples}",
        f"rollout.max_tokens={args.max_tokens}",
        f"logging.output_dir={out}",
        "logging.run_name=run",
        "logging.plot=false",
        "checkpoint.every=1000",
        "checkpoint.export_hf=false",
        "eval.every=null",
        f"eval.envs.0.num_tasks={args.eval_tasks}",
        # The whole curve is the measurement: a stretch of steps where every group ties (the
        # setter's problems all outside the band) is counted, not a reason to stop.
        "algorithm.max_empty_steps=null",
        *args.set,
    ]
    config = load_config(QUICKSTART, overrides)
    started = time.perf_counter()
    result = train(config)
    seconds = time.perf_counter() - started
    steps = sorted((result.run_dir / "trajectories").glob("step-*.jsonl"))
    rows = [step_row(read_trajectories(path), DEFAULT_BAND) for path in steps]
    held_out = [r["eval/two-digit/reward"] for r in result.history if "eval/two-digit/reward" in r]
    key = "batch/zero_variance_groups"
    tied = {r["step"]: r[key] for r in result.history if key in r}
    for path, row in zip(steps, rows, strict=True):  # by step number, as the files are named
        row["tied_groups"] = tied.get(int(path.stem.removeprefix("step-")), math.nan)
    return {"rows": rows, "held_out": held_out, "seconds": seconds}


def main() -> None:
    """Register the env in this process, train, print the table (and write ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=4, help="setter tasks per step")
    parser.add_argument("--samples", type=int, default=2, help="setters per task")
    parser.add_argument("--attempts", type=int, default=4, help="solvers per problem")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument(
        "--nudge",
        type=float,
        default=inspect.signature(SetterSolverEnv).parameters["nudge"].default,
        help="setter-solver's nudge toward the band (default: the env's, none)",
    )
    parser.add_argument(
        "--solver",
        choices=sorted(k for k in SetterSolverEnv.fixed_policies if k != "random"),
        help="a fixed solver (the env's); the policy then plays the setter alone",
    )
    parser.add_argument("--eval-tasks", type=int, default=8)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a run-config override, as envhub train takes them (algorithm.aggregation=...)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--out", type=Path, help="keep the run here (logging.output_dir; default: a temporary one)"
    )
    args = parser.parse_args()
    envhub.register("setter-solver", SetterSolverEnv, override=True)
    if args.out is not None:  # kept: the run's trajectories, metrics and report
        results = run(args, args.out)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            results = run(args, Path(tmp))
    low, high = DEFAULT_BAND
    print(
        f"setter-solver, SmolLM2-135M, {args.steps} steps x {args.tasks} tasks x "
        f"{args.samples} setters x {args.attempts} {args.solver or 'trained'} solvers, "
        f"nudge {args.nudge}, seed {args.seed}, {results['seconds']:.0f} s"
    )
    print(f"rewarded band: solve rate in [{low}, {high}]")
    if args.set:
        print(f"config overrides: {' '.join(args.set)}")
    head = ("step", "problems", "invalid", "solve rate", "size", "in band", "setter r", "solver r")
    head += ("tied",)
    print("".join(f"{h:>12}" for h in head))
    for step, row in enumerate(results["rows"], 1):
        cells = [
            row[k] for k in ("problems", "invalid_share", "solve_rate", "size", "in_band_share")
        ]
        cells += [row["setter_reward"], row["solver_reward"], row.get("tied_groups", math.nan)]
        print(f"{step:>12}" + "".join(f"{c:>12.3f}" for c in cells))
    before, after = (results["held_out"] + [float("nan")] * 2)[:2]
    print(f"held-out two-digit reward (solver prompt): before {before:.3f}, after {after:.3f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
