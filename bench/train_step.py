"""Seconds per GRPO step of envhub's trainer against TRL's ``GRPOTrainer``, side by side.

Both sides run the same step (see ``bench/trl_grpo_step.py`` for the full list): SmolLM2-135M-
Instruct in fp32 on the CPU with 2 torch threads, 4 easy arithmetic tasks x 8 samples, at most
64 new tokens at temperature 1.0 / top_p 1.0, the arithmetic env's rubric, AdamW lr 5e-6, KL off,
token-level loss, one optimizer update per step, generation with HF ``generate``. Each side runs
1 warm-up step and 4 timed steps; the table shows medians over the timed steps.

envhub runs through ``envhub.trainer.loop.train`` with a config built here (temporary run dir,
no checkpoints to keep, no export, no plot, no saved trajectories). Two envhub defaults that
would make it do less work than TRL are turned off: dynamic sampling (dropping groups whose
rewards are all equal) and the sampler/trainer mismatch correction (TRL applies none without
vLLM). Micro-batches: TRL takes ``--micro-batch`` sequences per forward/backward; envhub packs
sequences up to a padded-token budget, here ``--micro-batch`` x 128 tokens (prompt ~40 + 64).

A step is the wall time between two per-step callbacks (envhub's ``Reporter.step``, TRL's
``on_step_end``), so it includes everything a step costs. Generation: envhub's ``time/rollout``
(sampling, detokenising, rewards), TRL's ``_generate_and_score_completions``; training is the
rest. The machine is shared, so CPU seconds of the process (all threads) are reported too: other
processes stretch wall time far more than this process's own CPU time. TRL runs first, in a
subprocess (``bench/trl_grpo_step.py``, needs ``pip install --no-deps trl``).

    .venv/bin/python bench/train_step.py [--side both|envhub|trl] [--trl-json trl.json] \
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from trl_grpo_step import (
    GENERATIONS,
    LR,
    MAX_NEW_TOKENS,
    PROMPTS_PER_STEP,
    add_common_arguments,
    step_record,
    summarize,
)

KEPT_METRICS = ("time/", "train/mismatch_", "sync/logprob_diff_")
"""Per-step metrics of envhub's run kept in the JSON: phase times, the sampler/trainer logprob
gap on the trained tokens and on the sync check's fixed sequence."""

DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
"""envhub's ``model.dtype`` for each ``--precision`` (bfloat16: autocast, fp32 master weights)."""

TOKENS_PER_SEQUENCE = 128
"""Padded-token budget per sequence for envhub's micro-batches (a prompt is ~40 tokens)."""


def envhub_config(output_dir: Path, args: argparse.Namespace) -> Any:
    """envhub's training config for the shared step."""
    from envhub.trainer.config import validate_config

    steps = args.warmup + args.steps
    return validate_config(
        {
            "steps": steps,
            "seed": args.seed,
            "model": {"name": "smollm2-135m", "dtype": DTYPES[args.precision]},
            "envs": [{"name": "arithmetic", "args": {"difficulty": "easy"}}],
            "rollout": {
                "tasks_per_step": PROMPTS_PER_STEP,
                "samples_per_task": GENERATIONS,
                "max_tokens": MAX_NEW_TOKENS,
                "temperature": 1.0,
                "top_p": 1.0,
                "engine": args.engine,
                "vllm": {
                    "dtype": args.engine_dtype,
                },
            },
            "algorithm": {
                "advantage": "grpo",
                "policy_loss": "ppo_clip",
                "eps_low": 0.2,
                "eps_high": 0.28,
                "aggregation": "token-mean",
                "kl_beta": 0.0,
                "dynamic_sampling": False,
                "mismatch": "none",
                "updates_per_step": 1,
            },
            "optimizer": {"lr": LR, "grad_clip": 1.0, "schedule": "constant"},
            "backend": {
                "device": "cpu",
                "threads": args.threads,
                "micro_batch_tokens": args.micro_batch * TOKENS_PER_SEQUENCE,
            },
            "logging": {
                "output_dir": str(output_dir),
                "run_name": "bench",
                "plot": False,
                "save_trajectories": False,
            },
            "checkpoint": {"every": steps + 1, "export_hf": False, "resume": "never"},
        }
    )


class StepClock:
    """A ``Reporter`` that stamps wall and CPU time at the start, at the end of each rollout and
    at the end of each step."""

    def __init__(self) -> None:
        self.marks: list[tuple[float, float]] = []
        self.rollout_ends: list[tuple[float, float]] = []

    @staticmethod
    def now() -> tuple[float, float]:
        """The current wall time and this process's CPU time (all threads), in seconds."""
        return time.perf_counter(), time.process_time()

    def start(self, config: Any, info: dict[str, Any]) -> None:
        """Stamp the start of the run, where the first step begins."""
        self.marks.append(self.now())

    def rollout_progress(self, done: int, total: int) -> None:
        """Stamp the end of a step's rollout, when its last episode is done."""
        if done == total:
            self.rollout_ends.append(self.now())

    def step(self, step: int, metrics: dict[str, float]) -> None:
        """Stamp the end of a step (and so the start of the next one)."""
        self.marks.append(self.now())

    def finish(self, result: Any) -> None:
        """Do nothing: the run's end is already stamped by its last step."""
        pass


def run_envhub(args: argparse.Namespace) -> dict[str, Any]:
    """Run ``warmup + steps`` steps of envhub's trainer and return per-step numbers + medians."""
    from envhub.trainer.loop import train
    from envhub.trainer.tracking import read_metrics

    clock = StepClock()
    with tempfile.TemporaryDirectory(prefix="envhub-bench-") as output_dir:
        config = envhub_config(Path(output_dir), args)
        train(config, clock)
        history = read_metrics(config.run_dir / "metrics.jsonl")
    if len(history) != len(clock.marks) - 1 or len(clock.rollout_ends) != len(history):
        raise RuntimeError(
            f"{len(history)} metric rows, {len(clock.marks) - 1} steps, "
            f"{len(clock.rollout_ends)} rollouts"
        )
    steps = []
    marks = zip(history, clock.marks[:-1], clock.marks[1:], clock.rollout_ends, strict=True)
    for row, begin, end, rollout_end in marks:
        tokens = row["rollout/completion_tokens"] * row["rollout/episodes"]
        record = step_record(
            end[0] - begin[0],
            row["time/rollout"],
            end[1] - begin[1],
            rollout_end[1] - begin[1],
            tokens,
        )
        record |= {k: v for k, v in row.items() if k.startswith(KEPT_METRICS)}
        steps.append(record)
    return {
        "side": "envhub",
        "version": _version("envhub"),
        "steps": steps,
        "summary": summarize(steps, args.warmup),
    }


def run_trl(args: argparse.Namespace) -> dict[str, Any]:
    """Run ``bench/trl_grpo_step.py`` in its own process (a fresh heap, its own imports)."""
    with tempfile.TemporaryDirectory(prefix="trl-bench-") as tmp:
        out = Path(tmp) / "trl.json"
        command = [
            sys.executable,
            str(Path(__file__).with_name("trl_grpo_step.py")),
            "--json",
            str(out),
        ]
        for flag in ("steps", "warmup", "threads", "micro_batch", "precision", "seed"):
            command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
        subprocess.run(command, check=True)
        return json.loads(out.read_text())


def compare(envhub: dict[str, Any] | None, trl: dict[str, Any] | None) -> dict[str, Any]:
    """Both sides' summaries and the ratio TRL / envhub of each number."""
    result: dict[str, Any] = {"envhub": envhub, "trl": trl}
    if envhub is not None and trl is not None:
        ours, theirs = envhub["summary"], trl["summary"]
        result["ratio_trl_over_envhub"] = {
            k: theirs[k] / ours[k] for k in ours if k in theirs and ours[k]
        }
    return result


COLUMNS = [
    ("step_s", "step s"),
    ("generation_s", "gen s"),
    ("train_s", "train s"),
    ("step_cpu_s", "cpu s"),
    ("generation_cpu_s", "gen cpu s"),
    ("train_cpu_s", "train cpu s"),
    ("tokens_per_step", "tokens"),
    ("tokens_per_s", "tokens/s"),
]


def print_table(result: dict[str, Any]) -> None:
    """Medians of each side, then the TRL / envhub ratios."""
    print(f"{'':<14}" + "".join(f"{title:>12}" for _, title in COLUMNS))
    for side in ("envhub", "trl"):
        if result[side] is not None:
            s = result[side]["summary"]
            label = f"{side} {result[side]['version']}"
            print(f"{label:<14}" + "".join(f"{s[key]:>12.2f}" for key, _ in COLUMNS))
    ratio = result.get("ratio_trl_over_envhub")
    if ratio:
        print(
            f"{'trl / envhub':<14}"
            + "".join(f"{ratio.get(key, float('nan')):>12.2f}" for key, _ in COLUMNS)
        )
    loads = [
        result[side]["summary"]["load_average_1m"] for side in ("envhub", "trl") if result[side]
    ]
    print(f"(medians of the timed steps; 1-minute load average at the end of each side: {loads})")
    ours = result["envhub"]["summary"] if result["envhub"] else {}
    if "train/mismatch_kl" in ours:
        print(
            "envhub sampler vs trainer on the trained tokens: "
            f"KL {ours['train/mismatch_kl']:.2e}, "
            f"mean |logprob diff| {ours['train/mismatch_abs_logprob_diff_mean']:.2e}, "
            f"max {ours['train/mismatch_abs_logprob_diff_max']:.3f}"
        )


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def main() -> None:
    """Run the chosen sides (or reuse a saved TRL result), print the table, and save the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_arguments(parser)
    parser.add_argument("--side", choices=["both", "envhub", "trl"], default="both")
    parser.add_argument(
        "--engine",
        choices=["hf", "vllm"],
        default="hf",
        help="envhub's rollout engine: HF generate as TRL (default), or vLLM (a vllm serve child "
        "process on the same cores, weights synced after every step)",
    )
    parser.add_argument(
        "--engine-dtype",
        choices=["auto", "float32", "bfloat16"],
        default="auto",
        help="vLLM's dtype (default auto: the trainer's precision)",
    )
    parser.add_argument(
        "--trl-json", type=Path, default=None, help="reuse a trl_grpo_step.py result"
    )
    args = parser.parse_args()
    trl = None
    if args.trl_json is not None:
        trl = json.loads(args.trl_json.read_text())
    elif args.side in ("both", "trl"):
        trl = run_trl(args)
    envhub = run_envhub(args) if args.side in ("both", "envhub") else None
    result = compare(envhub, trl)
    print_table(result)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
