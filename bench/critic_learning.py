"""PPO with a critic against GRPO on a multi-turn env with per-turn rewards, within the CPU
quickstart's budget: reward curves side by side, and the critic's explained variance per step.

The env is ``guess-number`` on 1..8 (4 guesses) with ``progress_reward=0.5``: every guess pays
its share of the information the hint gave (up to 0.5 in all), the win pays 1.0 more. Each run
trains SmolLM2-135M-Instruct on the CPU with the in-process HF engine for ``--steps`` steps of
4 tasks x 4 samples (a multi-turn episode is ~4x the quickstart's tokens), same seed, and
evaluates 16 held-out secrets greedily before the first step and every 5 steps:

- ``grpo``: the quickstart's algorithm (GRPO on episode rewards, dynamic sampling);
- ``rloo-turn``: per-turn credit without a critic (RLOO per turn position on the returns);
- ``ppo``: PPO with a critic (``advantage: gae`` over tokens, ``credit: turn``, lambda 0.95),
  the critic a value head on a copy of the policy.

    .venv/bin/python bench/critic_learning.py [--runs grpo ppo] [--steps 20] \
        [--critic-lr 2e-5] [--png docs/critic-vs-grpo.png] [--json out.json] \
        [--suffix " (critic lr 1e-4)" --previous earlier.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from envhub.trainer.config import validate_config
from envhub.trainer.loop import train

ROOT = Path(__file__).resolve().parents[1]

ENV = {"name": "guess-number", "args": {"low": 1, "high": 8, "progress_reward": 0.5}}
HELD_OUT = {
    "name": "guess-number",
    "label": "greedy",
    "args": {**ENV["args"], "task_seed": 1},
    "num_tasks": 16,
}
ALGORITHMS: dict[str, dict[str, Any]] = {
    "grpo": {"advantage": "grpo"},
    "rloo-turn": {"advantage": "rloo", "credit": "turn"},
    "ppo": {
        "advantage": "gae",
        "credit": "turn",
        "lam": 0.95,
        "dynamic_sampling": False,
    },
}


def run_config(
    name: str, steps: int, out: Path, seed: int, critic_lr: float = 2e-5
) -> dict[str, Any]:
    """The training run ``name``: the same run but for its ``algorithm`` part."""
    return {
        "steps": steps,
        "seed": seed,
        "model": {"name": "smollm2-135m"},
        "envs": [ENV],
        "rollout": {
            "tasks_per_step": 4,
            "samples_per_task": 4,
            "max_tokens": 6,
            "temperature": 1.0,
        },
        "algorithm": ALGORITHMS[name],
        "critic": {"lr": critic_lr},
        "optimizer": {"lr": 2e-5, "grad_clip": 1.0},
        "backend": {"device": "cpu", "micro_batch_tokens": 2048},
        "logging": {"output_dir": str(out), "run_name": name, "plot": False},
        "checkpoint": {"every": steps, "keep_last": 1, "export_hf": False, "resume": "never"},
        "eval": {"envs": [HELD_OUT], "every": 5},
    }


def run(name: str, steps: int, out: Path, seed: int, critic_lr: float) -> dict[str, Any]:
    """Train run ``name`` and return its metric rows and wall time."""
    started = time.perf_counter()
    result = train(validate_config(run_config(name, steps, out, seed, critic_lr)))
    seconds = time.perf_counter() - started
    print(f"{name}: {seconds:.0f} s", flush=True)
    return {"seconds": seconds, "history": result.history}


def plot(results: dict[str, dict[str, Any]], png: Path) -> None:
    """Reward per step and held-out reward (left), the critic's explained variance (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, result in results.items():
        rows = [r for r in result["history"] if "reward/mean" in r]
        line = left.plot(
            [r["step"] for r in rows],
            [r["reward/mean"] for r in rows],
            label=f"{name} ({result['seconds'] / 60:.0f} min)",
        )[0]
        evals = [r for r in result["history"] if "eval/reward" in r]
        left.plot(
            [r["step"] for r in evals],
            [r["eval/reward"] for r in evals],
            "--o",
            color=line.get_color(),
            markersize=4,
            label=f"{name}, greedy eval",
        )
        explained = [r for r in rows if "critic/explained_variance" in r]
        if explained:
            right.plot(
                [r["step"] for r in explained],
                [r["critic/explained_variance"] for r in explained],
                color=line.get_color(),
                label=name,
            )
    left.set(xlabel="step", ylabel="reward (max 1.5)", title="guess-number 1..8, dense reward")
    left.legend(fontsize=8)
    right.axhline(0.0, color="grey", linewidth=0.8)
    right.set(xlabel="step", ylabel="explained variance", title="the critic's values vs returns")
    right.legend(fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def main() -> None:
    """Run the comparison and print a table, write the PNG (and JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", default=["grpo", "ppo"], choices=sorted(ALGORITHMS))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--critic-lr", type=float, default=2e-5)
    parser.add_argument("--png", type=Path, default=ROOT / "docs" / "critic-vs-grpo.png")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--suffix", default="", help="added to the runs' names in the table")
    parser.add_argument("--previous", type=Path, help="a --json file whose runs to show too")
    args = parser.parse_args()
    results = json.loads(args.previous.read_text()) if args.previous else {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.runs:
            results[name + args.suffix] = run(
                name, args.steps, Path(tmp), args.seed, args.critic_lr
            )
    print(f"{'run':28} {'min':>5} {'reward first5':>13} {'last5':>6} {'greedy 0 -> end':>16}")
    for name, result in results.items():
        rows = [r["reward/mean"] for r in result["history"] if "reward/mean" in r]
        evals = [r["eval/reward"] for r in result["history"] if "eval/reward" in r]
        print(
            f"{name:28} {result['seconds'] / 60:5.1f} {sum(rows[:5]) / 5:13.3f} "
            f"{sum(rows[-5:]) / 5:6.3f} {evals[0]:8.3f} -> {evals[-1]:.3f}"
        )
    plot(results, args.png)
    print(f"wrote {args.png}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
