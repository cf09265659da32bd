"""The quickstart at mixed difficulty with and without the online curriculum, side by side:
the share of tied groups (every sample of a task scored the same: no signal, rollouts wasted),
tokens trained per hour, and the held-out reward at the end.

Both runs are ``examples/quickstart.yaml`` (SmolLM2-135M-Instruct, GRPO, hf engine on the CPU)
with the same seed, on three arithmetic envs of equal weight: ``tiny`` (mastered within a few
steps), ``easy`` and ``hard`` (hopeless for a 135M model: groups tied at 0), each of
``--tasks-per-env`` tasks (default 8, so that tasks come round again within a short run: the
curriculum's statistics are per task, and a task seen once is never skipped). The second run
adds ``curriculum:`` (``--revisit``, ``--window``); with ``--levels`` it instead trains on one
arithmetic env that starts at ``tiny`` and moves between levels (``curriculum.levels``; what
moves them: ``--level-signal``, pass rates or ties). The
held-out eval is the quickstart's (32 two-digit problems, greedy), run once at the end.

A group is tied when all its samples' rewards are equal; tokens trained are the tokens (prompt
and completion) of the samples in groups that were not tied, per hour of the run's wall time
(model load and the final eval included, the same for both). Short by default (a smoke run of
about 5 minutes on 2 cores); the issue's measurement is the long run:

    .venv/bin/python bench/curriculum.py                       # 4 steps each, 8 eval tasks
    .venv/bin/python bench/curriculum.py --steps 40 --eval-tasks 32 --tasks-per-env 32 \
        [--levels] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, get_args

from envhub.rollout.io import iter_trajectories
from envhub.trainer.config import CurriculumConfig, LevelsConfig, load_config
from envhub.trainer.loop import train

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
MIXED = ("tiny", "easy", "hard")


def run(args: argparse.Namespace, curriculum: dict[str, Any] | None, out: Path) -> dict:
    """One training run; its tied share, tokens trained per hour and held-out reward."""
    overrides = [
        f"steps={args.steps}",
        f"seed={args.seed}",
        f"logging.output_dir={out}",
        "logging.run_name=run",
        "logging.plot=false",
        "checkpoint.every=1000",
        "checkpoint.export_hf=false",
        "eval.every=null",
        "eval.baseline=false",
        f"eval.envs.0.num_tasks={args.eval_tasks}",
        # A measurement wants the whole run: steps where every group ties are what it counts,
        # not a reason to stop (a run stopped at its last step has no held-out reward).
        "algorithm.max_empty_steps=null",
    ]
    levels = ("tiny",) if args.levels and curriculum is not None else MIXED
    envs = [
        {"name": "arithmetic", "args": {"difficulty": level, "num_tasks": args.tasks_per_env}}
        for level in levels
    ]
    overrides.append(f"envs={json.dumps(envs)}")
    if curriculum is not None:
        overrides.append(f"curriculum={json.dumps(curriculum)}")
    config = load_config(QUICKSTART, overrides)
    start = time.perf_counter()
    result = train(config)
    seconds = time.perf_counter() - start
    groups, tied, tokens = _groups(result.run_dir / "trajectories")
    final = result.history[-1]
    levels = {k: v for k, v in final.items() if k.startswith("curriculum/level/")}
    return {
        "groups": groups,
        "tied_share": tied / groups if groups else 0.0,
        "tokens_per_hour": tokens / seconds * 3600,
        "held_out_reward": final.get("eval/two-digit/reward", float("nan")),
        "seconds": seconds,
        "skipped": sum(r.get("curriculum/skipped", 0.0) for r in result.history),
        "final_levels": levels,
        "level_trace": {  # each step's level per levelled env (0: the easiest)
            key: [int(r[key]) for r in result.history if key in r] for key in levels
        },
    }


def _groups(folder: Path) -> tuple[int, int, int]:
    """Groups rolled out, of them tied, and tokens of the samples in untied groups."""
    groups = tied = tokens = 0
    for path in sorted(folder.glob("step-*.jsonl")):
        by_group: dict[str, list[Any]] = defaultdict(list)
        for t in iter_trajectories(path):
            by_group[t.group_id].append(t)
        for members in by_group.values():
            groups += 1
            if len({t.reward for t in members}) == 1:
                tied += 1
            else:
                tokens += sum(len(t.token_ids or ()) for t in members)
    return groups, tied, tokens


def main() -> None:
    """Run both, print the table (and write ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--eval-tasks", type=int, default=8)
    parser.add_argument("--tasks-per-env", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--revisit", type=float, default=0.1)
    parser.add_argument("--window", type=int, default=2)
    parser.add_argument("--levels", action="store_true", help="one env moved between levels")
    parser.add_argument(
        "--level-signal",
        choices=get_args(LevelsConfig.model_fields["signal"].annotation),
        default=LevelsConfig.model_fields["signal"].default,
        help="curriculum.levels.signal: what moves the level (with --levels)",
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--without",
        type=Path,
        help="a --json of an earlier run with the same settings: reuse its run without the "
        "curriculum (the same seed draws and samples the same) instead of running it again",
    )
    parser.add_argument("--env-window", type=int, default=16, help="curriculum.env_window")
    parser.add_argument(
        "--env-rule",
        choices=get_args(CurriculumConfig.model_fields["env_rule"].annotation),
        default=CurriculumConfig.model_fields["env_rule"].default,
        help="curriculum.env_rule: how env_window's counts choose envs",
    )
    parser.add_argument(
        "--keep", type=Path, help="keep both runs' output here (default: a temporary folder)"
    )
    args = parser.parse_args()
    curriculum: dict[str, Any] = {
        "revisit": args.revisit,
        "window": args.window,
        "env_window": args.env_window,
        "env_rule": args.env_rule,
    }
    if args.levels:
        curriculum["levels"] = {
            "window": 8,
            "promote_above": 0.8,
            "demote_below": 0.2,
            "signal": args.level_signal,
        }
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.keep or scratch
        results = {
            "without": (
                json.loads(args.without.read_text())["without"]
                if args.without
                else run(args, None, Path(tmp) / "off")
            ),
            "with": run(args, curriculum, Path(tmp) / "on"),
        }
    print(f"quickstart at mixed difficulty, {args.steps} steps, seed {args.seed}")
    print(f"{'':24}{'without':>12}{'with':>12}")
    for key, fmt in [
        ("groups", "{:12.0f}"),
        ("tied_share", "{:12.3f}"),
        ("tokens_per_hour", "{:12.0f}"),
        ("held_out_reward", "{:12.3f}"),
        ("seconds", "{:12.1f}"),
        ("skipped", "{:12.0f}"),
    ]:
        row = "".join(fmt.format(results[side][key]) for side in ("without", "with"))
        print(f"{key:24}{row}")
    if results["with"]["final_levels"]:
        print(f"final levels (0: tiny): {results['with']['final_levels']}")
        for key, trace in results["with"].get("level_trace", {}).items():
            print(f"{key} by step: {' '.join(map(str, trace))}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
