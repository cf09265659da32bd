"""Kill a training run at random moments and check that nothing is left and nothing is lost.

For each of ``--moments`` seeded moments: start ``envhub train`` (a tiny random Llama on
``envhub.testing:LetterEnv``, a checkpoint every step), SIGKILL it after a delay drawn
uniformly over an uninterrupted run's wall time (so the kill lands anywhere: the start, a
rollout, an update, a checkpoint write, the export; a run that ends before its kill, as on a
faster or less busy machine, is started again with three quarters of the delay, twice at
most), then check

- **left**: everything below the killed process in the process tree at the kill has ended
  10 s later, and no ``/dev/shm`` entry its processes mapped (or the weights file its driver
  shared) is still there unless a live process maps it;
- **resumed**: running the same command again finishes the run;
- **steps**: its ``metrics.jsonl`` has each step once, in order;
- **data**: with the HF engine, each step trained on the same groups of the same tasks as the
  uninterrupted run; with vLLM (whose timing decides which finished groups an asynchronous
  step takes), no group is trained twice, each group is of the same task as in the
  uninterrupted run (the data order resumed), and each step trained as many groups;
- **metrics**: each step's metrics equal the uninterrupted run's (all but timings, which
  differ; HF engine only: vLLM's sampling on a CPU is not the same across two runs, so its
  rewards and losses differ even between two uninterrupted runs);
- **weights**: the final model's tensors equal the uninterrupted run's (HF engine only).

Engines: ``--engine hf`` (deterministic; the default) or ``vllm``; ``--async`` trains with
``max_staleness: 1``; ``--backend megatron`` trains with two megatron-core ranks (PP=2, gloo)
and a vLLM engine, all placed by Ray (as vLLM: no metrics or weights compared). The harness
prints one row per moment and a summary line, and writes
``--json``. 20 moments with the HF engine take about 12 minutes on 2 cores:

    .venv/bin/python bench/kill_runs.py --moments 20 [--engine vllm] [--async] [--seed 0]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

LEFT_WITHIN_S = 10.0
RETRIES = 2
"""How many times a run that ended before its kill is started again, with a shorter delay."""
VARIABLE = ("time/", "seconds", "per_s", "memory", "mfu", "cores/")
"""Metric name parts that measure time, memory or the core split (which a resumed run sets
from the phases it measured): they differ between any two runs."""


def tiny_model(folder: Path) -> Path:
    """A 2-layer random Llama with SmolLM2's tokenizer in ``folder`` (made once)."""
    if (folder / "config.json").exists():
        return folder
    import torch  # noqa: TID251 - a script outside the package; it makes a model
    import transformers

    from envhub.trainer.models import resolve_model

    tokenizer = transformers.AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=512,
        tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def run_config(model: Path, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The run every moment repeats."""
    rollout: dict[str, Any] = {"tasks_per_step": 4, "samples_per_task": 4, "max_tokens": 16}
    backend: dict[str, Any] = {"device": "cpu", "micro_batch_tokens": 128}
    if args.engine == "vllm":
        rollout |= {"engine": "vllm", "vllm": {"kv_cache_gb": 1}}
    if args.backend == "megatron":
        rollout["vllm"]["mode"] = "ray"
        backend = {"kind": "megatron", "megatron": {"pipeline_parallel": 2}}
    if args.asynchronous:
        rollout |= {"max_staleness": 1}
    return {
        "steps": args.steps, "seed": 5, "model": {"name": str(model)},
        "envs": [{"name": "envhub.testing:LetterEnv"}], "rollout": rollout,
        "optimizer": {"lr": 1e-3}, "backend": backend,
        "logging": {"output_dir": str(out), "run_name": "run", "plot": False},
        "checkpoint": {"every": 1, "keep_last": 2},
    }  # fmt: skip


MEGATRON_CPU = Path(__file__).resolve().parents[1] / "tests/trainer/megatron/cpu_compat.py"
"""What megatron-core's ranks load first on a CPU (the tests' compatibility module)."""


def start(config: Path) -> subprocess.Popen[bytes]:
    """``envhub train CONFIG``, quiet (Megatron's ranks get the CPU compatibility module)."""
    command = [sys.executable, "-m", "envhub.cli", "train", str(config)]
    env = {**os.environ, "ENVHUB_MEGATRON_WORKER_SETUP": str(MEGATRON_CPU)}
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)


def finish(config: Path, run: Path | None = None) -> tuple[float, float]:
    """Run ``envhub train CONFIG`` to the end: its wall time, and (when ``run`` is given) when
    its first step began, estimated as its first metrics line less one step's mean time (the
    imports, the model load and an engine's start come before)."""
    started = time.monotonic()
    first = None
    process = start(config)
    while run is not None and process.poll() is None and first is None:
        if (run / "metrics.jsonl").exists() and (run / "metrics.jsonl").read_text():
            first = time.monotonic() - started
        time.sleep(0.02)
    _, stderr = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"the run failed:\n{stderr.decode()[-3000:]}")
    wall = time.monotonic() - started
    if first is None:
        return wall, 0.0
    steps = len(_rows(run)) if run is not None else 1
    return wall, max(0.0, first - (wall - first) / max(steps, 1))


def shm_in_use() -> set[str]:
    """The ``/dev/shm`` entries some running process maps."""
    from envhub.lifetime.procs import mapped_by, pids

    return mapped_by(pids())


def kill_at(config: Path, delay: float, run: Path) -> dict[str, Any]:
    """Start the run, SIGKILL it after ``delay`` s; what it had done and what it left."""
    process = start(config)
    deadline = time.monotonic() + delay
    below: dict[int, psutil.Process] = {}
    shm: set[str] = set()
    while time.monotonic() < deadline and process.poll() is None:
        note(process, below, shm)  # as it goes: the kill must find what exists at its moment
        time.sleep(0.05)
    if process.poll() is not None:
        return {"killed": False}
    note(process, below, shm)
    process.send_signal(signal.SIGKILL)
    process.wait()
    done = len(_rows(run))
    checkpoints = sorted(p.name for p in (run / "checkpoints").glob("step-*"))
    _, alive = psutil.wait_procs(list(below.values()), timeout=LEFT_WITHIN_S)
    left = [" ".join(p.cmdline())[:80] for p in alive if _running(p)]
    shm |= {path.name for path in Path("/dev/shm").glob(f"envhub-weights-{process.pid}-*")}
    shm_left = sorted(n for n in shm - shm_in_use() if Path(f"/dev/shm/{n}").exists())
    return {"killed": True, "steps_logged": done, "checkpoints": checkpoints,
            "left": left, "shm_left": shm_left}  # fmt: skip


def note(process: subprocess.Popen[bytes], below: dict[int, psutil.Process], shm: set[str]) -> None:
    """Add what runs below ``process`` to ``below``, and the ``/dev/shm`` entries they map to
    ``shm`` (so that another program's entries on a shared machine are never counted)."""
    from envhub.lifetime.procs import mapped_by

    try:
        below |= {p.pid: p for p in psutil.Process(process.pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return
    shm |= mapped_by([process.pid, *below])


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _rows(run: Path) -> list[dict[str, Any]]:
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            rows.append({"step": "partial line"})
    return rows


def comparable(row: dict[str, Any]) -> dict[str, Any]:
    """A metrics row without what differs between any two runs."""
    return {k: v for k, v in row.items() if not any(part in k for part in VARIABLE)}


def groups(run: Path, steps: int) -> list[list[tuple[str, int]]]:
    """Each step's trained groups: (group id, task index) of its episodes, sorted."""
    from envhub.rollout.io import iter_trajectories

    found = []
    for step in range(1, steps + 1):
        path = run / "trajectories" / f"step-{step:06d}.jsonl"
        episodes = iter_trajectories(path) if path.exists() else []
        found.append(sorted({(t.group_id, t.task_index) for t in episodes}))
    return found


def digest(model: Path) -> str:
    """A hash of every tensor of an HF folder's safetensors, by name."""
    from safetensors import safe_open

    h = hashlib.sha256()
    for file in sorted(model.glob("*.safetensors")):
        with safe_open(file, "np") as f:  # the run saves float32: numpy reads it
            for name in sorted(f.keys()):
                h.update(name.encode())
                h.update(f.get_tensor(name).tobytes())
    return h.hexdigest()[:16]


def moment(index: int, args: argparse.Namespace, model: Path, baseline: dict[str, Any]) -> dict:
    """Kill one run at the ``index``-th seeded moment, resume it, compare it with the baseline."""
    # One kill in five during the start, the rest in the steps.
    rng = random.Random(f"{args.seed}:{index}")
    began, wall = baseline["began_s"], baseline["wall_s"]
    delay = rng.uniform(0.0, began) if rng.random() < 0.2 else rng.uniform(began, wall)
    out = args.out / f"moment-{index:02d}"
    shutil.rmtree(out, ignore_errors=True)
    config = out / "run.yaml"
    config.parent.mkdir(parents=True)
    config.write_text(yaml.safe_dump(run_config(model, out, args)))
    run = out / "run"
    for _ in range(1 + RETRIES):
        shutil.rmtree(run, ignore_errors=True)
        result: dict[str, Any] = {"moment": index, "delay_s": round(delay, 2)}
        result |= kill_at(config, delay, run)
        if result["killed"]:
            break
        delay *= 0.75
    result["resume_s"] = round(finish(config)[0], 1)
    rows = _rows(run)
    result["steps_ok"] = [r["step"] for r in rows] == list(range(1, args.steps + 1))
    result["data_equal"] = same_data(groups(run, args.steps), baseline["groups"], args.engine)
    if args.engine == "hf":
        result["metrics_equal"] = result["steps_ok"] and all(
            comparable(a) == comparable(b) for a, b in zip(rows, baseline["rows"], strict=True)
        )
        result["weights_equal"] = digest(run / "final") == baseline["digest"]
    shutil.rmtree(out / "run" / "checkpoints", ignore_errors=True)  # the disk, on long runs
    return result


def survived(result: dict[str, Any]) -> bool:
    """Whether a moment passed every check."""
    return (
        not result.get("left")
        and not result.get("shm_left")
        and result["steps_ok"]
        and result["data_equal"]
        and result.get("metrics_equal", True)
        and result.get("weights_equal", True)
    )


def same_data(
    run: list[list[tuple[str, int]]], base: list[list[tuple[str, int]]], engine: str
) -> bool:
    """Whether a resumed run's groups per step are the uninterrupted run's (see the module's
    docstring for what that means with each engine)."""
    if engine == "hf":
        return run == base
    trained = [group for step in run for group, _ in step]
    tasks, base_tasks = dict(sum(run, [])), dict(sum(base, []))
    return (
        len(trained) == len(set(trained))
        and all(tasks[g] == base_tasks[g] for g in tasks.keys() & base_tasks.keys())
        and [len(step) for step in run] == [len(step) for step in base]
    )


def main() -> None:
    """The command line (see the module's docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--moments", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    parser.add_argument("--backend", choices=["torch", "megatron"], default="torch")
    parser.add_argument("--async", dest="asynchronous", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("bench-out/kill-runs"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.backend == "megatron":
        args.engine = "vllm"  # Megatron's ranks serve vLLM engines, not the HF engine
    args.out = args.out.resolve()
    model = tiny_model(args.out / "model")

    base = args.out / "baseline"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    (base / "run.yaml").write_text(yaml.safe_dump(run_config(model, base, args)))
    wall, began = finish(base / "run.yaml", base / "run")
    baseline = {
        "wall_s": wall,
        "began_s": began,
        "rows": _rows(base / "run"),
        "groups": groups(base / "run", args.steps),
    }
    if args.engine == "hf":
        baseline["digest"] = digest(base / "run" / "final")
    print(f"uninterrupted: {args.steps} steps in {wall:.1f} s, the first began at {began:.1f} s "
          f"({args.backend} backend, {args.engine} engine"
          f"{', async' if args.asynchronous else ''})")  # fmt: skip
    print("moment  delay s  logged  checkpoints  left  shm  resumed s  steps  data  metrics  "
          "weights")  # fmt: skip
    results = []
    for index in range(args.moments):
        r = moment(index, args, model, baseline)
        results.append(r)
        if not r["killed"]:
            print(f"{index:6d}  {r['delay_s']:7.2f}  (finished before the kill)")
            continue
        print(
            f"{index:6d}  {r['delay_s']:7.2f}  {r['steps_logged']:6d}  "
            f"{(r['checkpoints'] or ['-'])[-1]:>11}  {len(r['left']):4d}  "
            f"{len(r['shm_left']):3d}  {r['resume_s']:9.1f}  {_yes(r['steps_ok']):>5}  "
            f"{_yes(r['data_equal']):>4}  {_yes(r.get('metrics_equal')):>7}  "
            f"{_yes(r.get('weights_equal')):>7}"
        )
        for line in r["left"] + r["shm_left"]:
            print(f"        left: {line}")
    killed = [r for r in results if r["killed"]]
    ok = sum(survived(r) for r in killed)
    print(f"survived {ok} of {len(killed)} kills ({len(results) - len(killed)} runs ended first)")
    if args.json:
        args.json.write_text(json.dumps({"baseline_wall_s": wall, "moments": results}, indent=2))
    sys.exit(0 if ok == len(killed) else 1)


def _yes(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "NO")


if __name__ == "__main__":
    main()
