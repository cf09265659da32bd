"""TRL's ``GRPOTrainer`` on the arithmetic env: seconds per GRPO step, split into generation
and training, for the side-by-side with envhub's trainer (``bench/train_step.py``).

The step is the one ``bench/train_step.py`` runs on envhub: SmolLM2-135M-Instruct (the local
folder from ``resolve_model("smollm2-135m")``), fp32 on the CPU, 2 torch threads; 4 prompts of
the arithmetic env's easy tasks (chat: system + user) x 8 generations, at most 64 new tokens,
temperature 1.0, top_p 1.0; the env's own rubric as the reward (math answer 1.0 + boxed 0.1);
AdamW at lr 5e-6, beta (KL) 0, token-level loss (``loss_type="dapo"``), one optimizer update per
step (``num_iterations=1``, gradient accumulation over the 32 completions), HF ``generate``.
TRL's own defaults that would make the step differ are turned off: gradient checkpointing (TRL
turns it on) and bf16 (TRL turns it on). TRL is a bench-only dependency, not in pyproject:

    .venv/bin/pip install --no-deps trl     # its other requirements are already in the venv
    .venv/bin/python bench/trl_grpo_step.py [--steps 4] [--warmup 1] [--json trl.json]

Timing: a step is the wall time between two ``on_step_end`` callbacks (the first step is
timed from ``on_train_begin`` and is the warm-up); generation is the time spent in
``_generate_and_score_completions`` (sampling, decoding and rewards, as in envhub's rollout
phase); training is the rest (forward/backward over the micro-batches, optimizer, logging).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import envhub
from envhub.envs.arithmetic import SYSTEM_PROMPT, problem_set

PROMPTS_PER_STEP = 4
GENERATIONS = 8
MAX_NEW_TOKENS = 64
LR = 5e-6


def build_dataset(size: int, seed: int = 0) -> Any:
    """The arithmetic env's easy tasks as a TRL conversational prompt dataset."""
    from datasets import Dataset

    tasks = problem_set("easy", size, seed)
    rows = [
        {
            "prompt": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": t["question"]},
            ],
            "answer": t["answer"],
        }
        for t in tasks
    ]
    return Dataset.from_list(rows)


def make_reward() -> Any:
    """A TRL reward function scoring each completion with the arithmetic env's own rubric."""
    rubric = envhub.make("arithmetic").rubric
    funcs = rubric.episode_funcs

    def arithmetic_rubric(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
        scores = []
        for completion, gold in zip(completions, answer, strict=True):
            text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
            available = {"response": text, "answer": gold}
            scores.append(
                sum(f.weight * float(f.fn(**{k: available[k] for k in f.params})) for f in funcs)
            )
        return scores

    return arithmetic_rubric


def step_record(
    step_s: float, generation_s: float, step_cpu_s: float, generation_cpu_s: float, tokens: float
) -> dict[str, float]:
    """One step's numbers: wall seconds, process CPU seconds (all threads), generated tokens.

    CPU seconds are kept because the machine is shared: another process stretches wall time
    far more than it stretches the CPU time this process itself spends.
    """
    return {
        "step_s": step_s,
        "generation_s": generation_s,
        "train_s": step_s - generation_s,
        "step_cpu_s": step_cpu_s,
        "generation_cpu_s": generation_cpu_s,
        "train_cpu_s": step_cpu_s - generation_cpu_s,
        "tokens": float(tokens),
    }


def summarize(steps: list[dict[str, float]], warmup: int) -> dict[str, float]:
    """Medians over the timed steps (the first ``warmup`` are left out).

    Args:
        steps: One :func:`step_record` per step.
        warmup: Steps at the start that are not timed.
    """
    timed = steps[warmup:]
    if not timed:
        raise ValueError(f"no timed steps: {len(steps)} steps, {warmup} of them warm-up")
    keys = [
        key for key in timed[0] if key != "tokens" and all(s.get(key) is not None for s in timed)
    ]
    summary = {key: statistics.median(s[key] for s in timed) for key in keys}
    summary["tokens_per_step"] = statistics.median(s["tokens"] for s in timed)
    summary["tokens_per_s"] = statistics.median(s["tokens"] / s["step_s"] for s in timed)
    summary["timed_steps"] = float(len(timed))
    summary["load_average_1m"] = os.getloadavg()[0]
    return summary


def grpo_config(output_dir: str, args: argparse.Namespace) -> Any:
    """TRL's config for the shared step (see the module docstring)."""
    from trl import GRPOConfig

    completions = PROMPTS_PER_STEP * GENERATIONS
    return GRPOConfig(
        output_dir=output_dir,
        use_cpu=True,
        bf16=args.precision == "bf16",  # accelerate: CPU autocast over fp32 weights
        fp16=False,
        gradient_checkpointing=False,
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=completions // args.micro_batch,
        num_generations=GENERATIONS,
        max_completion_length=MAX_NEW_TOKENS,
        temperature=1.0,
        top_p=1.0,
        learning_rate=LR,
        lr_scheduler_type="constant",
        optim="adamw_torch",
        max_grad_norm=1.0,
        beta=0.0,
        num_iterations=1,
        loss_type="dapo",
        scale_rewards="group",
        epsilon=0.2,
        epsilon_high=0.28,
        use_vllm=False,
        max_steps=args.warmup + args.steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=args.seed,
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Train ``warmup + steps`` GRPO steps with TRL and return per-step times and their medians."""
    import torch  # noqa: TID251 - the benchmark runs torch; nothing imports this module
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOTrainer

    from envhub.trainer.models import resolve_model

    torch.set_num_threads(args.threads)
    path = resolve_model("smollm2-135m")
    generation: list[tuple[float, float, int]] = []

    class TimedGRPOTrainer(GRPOTrainer):
        def _generate_and_score_completions(self, inputs: Any) -> Any:
            wall, cpu = time.perf_counter(), time.process_time()
            output = super()._generate_and_score_completions(inputs)
            tokens = int(output["completion_mask"].sum().item())
            generation.append((time.perf_counter() - wall, time.process_time() - cpu, tokens))
            return output

    ends: list[tuple[float, float]] = []

    class StepClock(TrainerCallback):
        def on_train_begin(self, *_: Any, **__: Any) -> None:
            ends.append((time.perf_counter(), time.process_time()))

        def on_step_end(self, *_: Any, **__: Any) -> None:
            ends.append((time.perf_counter(), time.process_time()))

    with tempfile.TemporaryDirectory(prefix="trl-bench-") as output_dir:
        trainer = TimedGRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
            processing_class=AutoTokenizer.from_pretrained(path),
            reward_funcs=make_reward(),
            args=grpo_config(output_dir, args),
            train_dataset=build_dataset(256, args.seed),
            callbacks=[StepClock()],
        )
        trainer.train()
    if len(generation) != len(ends) - 1:
        raise RuntimeError(
            "expected one generation per optimizer step, "
            f"got {len(generation)} for {len(ends) - 1} steps"
        )
    steps = [
        step_record(end[0] - begin[0], gen, end[1] - begin[1], gen_cpu, tokens)
        for begin, end, (gen, gen_cpu, tokens) in zip(ends[:-1], ends[1:], generation, strict=True)
    ]
    return {
        "side": "trl",
        "version": _version("trl"),
        "steps": steps,
        "summary": summarize(steps, args.warmup),
    }


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """Options both sides of the benchmark share."""
    parser.add_argument("--steps", type=int, default=4, help="timed steps (default 4)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (default 1)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    parser.add_argument(
        "--micro-batch", type=int, default=8, help="sequences per forward/backward (default 8)"
    )
    parser.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        default="fp32",
        help="fp32, or bf16 autocast over fp32 master weights on both sides (default fp32)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="write the numbers to this file")


def main() -> None:
    """Run TRL's side alone, print its medians, and save the JSON when ``--json`` is given."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_arguments(parser)
    args = parser.parse_args()
    if (PROMPTS_PER_STEP * GENERATIONS) % args.micro_batch:
        parser.error(f"--micro-batch must divide {PROMPTS_PER_STEP * GENERATIONS}")
    result = run(args)
    s = result["summary"]
    print(
        f"trl {result['version']}: {s['step_s']:.2f} s/step (generation {s['generation_s']:.2f} s, "
        f"training {s['train_s']:.2f} s), {s['tokens_per_s']:.1f} generated tokens/s"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
