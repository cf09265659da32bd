"""The tinker cookbook's basic recipes, unmodified, against envhub's training service.

``tinker_cookbook.recipes.sl_basic`` (supervised) and ``tinker_cookbook.recipes.rl_basic`` (RL)
run as their own processes, exactly as a user runs them (``python -m ...`` with chz flags),
against the service started here in a thread; the service URL goes in by their ``base_url``
flag, the key by ``TINKER_API_KEY``. Only flags change, never the recipes' code:

- **The model.** The cookbook knows models by their Tinker names (it picks a renderer and a
  tokenizer by name); SmolLM2-135M-Instruct, which two CPU cores train, is none of them. The
  service serves it under ``meta-llama/Llama-3.2-1B`` (``--model`` here; the service's
  ``NAME=MODEL`` mapping), the same Llama architecture, for which the cookbook picks its
  plain ``role_colon`` renderer. The cookbook loads that name's tokenizer from the Hub; with no
  network here, a Hub cache made in a temporary folder (``HF_HOME``, ``HF_HUB_OFFLINE=1``)
  holds SmolLM2's tokenizer under the name the cookbook asks for.
- **The data.** ``sl_basic``'s No Robots and ``rl_basic``'s GSM8K come from the Hub; the
  recipes take another dataset builder by flag: the cookbook's own example conversations
  (``example_data/conversations.jsonl``) and its arithmetic environment
  (``recipes/math_rl/arithmetic_env``), at tiny sizes.

Prints from each recipe's ``metrics.jsonl``: the supervised loss per step (``train_mean_nll``)
and on the held-out conversations (``test/nll``); the RL reward per step
(``env/all/reward/total``), with its parts (``correct``, ``format``); and the wall time.

    .venv/bin/python bench/cookbook_recipes.py [--sl-steps 8] [--rl-steps 8] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn

from envhub.defaults import LOOPBACK, free_port
from envhub.trainer.models import resolve_model
from envhub.trainer.service import ServiceSettings, build_app

SERVED_AS = "meta-llama/Llama-3.2-1B"
"""The name the recipes ask for (the cookbook knows it; its renderer is ``role_colon``)."""
TOKENIZER_REPO = "thinkingmachineslabinc/meta-llama-3-instruct-tokenizer"
"""Where the cookbook loads a ``meta-llama/Llama-3*`` model's tokenizer from."""
_TOKENIZER_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json",
                    "special_tokens_map.json", "chat_template.jinja")  # fmt: skip
"""What AutoTokenizer reads (config.json for the model type)."""


def start(settings: ServiceSettings) -> uvicorn.Server:
    """The service under uvicorn in a thread; returns once it accepts connections."""
    server = uvicorn.Server(uvicorn.Config(build_app(settings), host=LOOPBACK,
                                           port=settings.port, log_level="warning"))  # fmt: skip
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return server


def hub_cache(root: Path, model: str) -> Path:
    """An offline Hub cache under ``root`` whose ``TOKENIZER_REPO`` is ``model``'s tokenizer."""
    revision = "0" * 40
    repo = root / "hub" / ("models--" + TOKENIZER_REPO.replace("/", "--"))
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    for name in _TOKENIZER_FILES:
        if (Path(model) / name).is_file():
            shutil.copy(Path(model) / name, snapshot / name)
    return root


def sl_flags(steps: int, batch: int, data: Path | None = None, held_out: int = 16,
             learning_rate: float = 2e-4) -> list[str]:  # fmt: skip
    """sl_basic's flags: conversations from ``data`` (the cookbook's example conversations by
    default), ``steps`` batches of ``batch``, ``held_out`` of them scored (``compute_logprobs``)
    at the start, half-way and the end."""
    import tinker_cookbook

    if data is None:
        data = Path(tinker_cookbook.__file__).parent / "example_data" / "conversations.jsonl"
    common = "dataset_builder.common_config"
    every = max(1, steps // 2) if held_out else 0
    return [
        "dataset_builder=tinker_cookbook.supervised.data:FromConversationFileBuilder",
        f"dataset_builder.file_path={data}", f"dataset_builder.test_size={held_out}",
        f"{common}.model_name_for_tokenizer={SERVED_AS}", f"{common}.renderer_name=role_colon",
        f"{common}.max_length=256", f"{common}.batch_size={batch}",
        f"max_steps={steps}", "lora_rank=8", f"learning_rate={learning_rate}",
        f"eval_every={every}", "save_every=0",
    ]  # fmt: skip


def rl_flags(steps: int, groups: int, group_size: int) -> list[str]:
    """rl_basic's flags: the cookbook's arithmetic env, ``steps`` batches of ``groups`` problems
    with ``group_size`` samples each, answers of at most 16 tokens."""
    builder = "dataset_builder"
    return [
        f"{builder}=tinker_cookbook.recipes.math_rl.arithmetic_env:ArithmeticDatasetBuilder",
        f"{builder}.model_name_for_tokenizer={SERVED_AS}", f"{builder}.renderer_name=role_colon",
        f"{builder}.batch_size={groups}", f"{builder}.group_size={group_size}",
        f"{builder}.n_batches={steps}", "max_tokens=16", "lora_rank=8", "learning_rate=1e-4",
        "eval_every=0", "save_every=0",
    ]  # fmt: skip


def run_recipe(module: str, flags: list[str], url: str, key: str, hf_home: Path,
               log_path: Path) -> dict[str, Any]:  # fmt: skip
    """Run a recipe as a user does; its metrics per step and its wall time."""
    offline = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env = {**os.environ, **offline, "TINKER_API_KEY": key, "HF_HOME": str(hf_home)}
    command = [sys.executable, "-m", module, f"model_name={SERVED_AS}", f"base_url={url}",
               f"log_path={log_path}", *flags]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800,
                          stdin=subprocess.DEVNULL)  # fmt: skip
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{module} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    metrics = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]
    return {"wall_s": round(wall, 1), "metrics": metrics, "command": command[1:]}


def series(metrics: list[dict], key: str) -> list[float]:
    """``key`` at every step that logged it."""
    return [round(m[key], 4) for m in metrics if key in m]


def main() -> None:
    """Run both recipes against one service and print what they logged."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sl-steps", type=int, default=8)
    parser.add_argument("--sl-batch", type=int, default=8)
    parser.add_argument("--rl-steps", type=int, default=8)
    parser.add_argument("--rl-groups", type=int, default=2)
    parser.add_argument("--rl-group-size", type=int, default=4)
    parser.add_argument("--only", choices=["sl", "rl"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="envhub-cookbook-"))
    model = resolve_model("smollm2-135m")
    settings = ServiceSettings(models=(f"{SERVED_AS}={model}",), device="cpu",
                               port=free_port(), state_dir=work / "state")  # fmt: skip
    server = start(settings)
    url, hf_home = f"http://{LOOPBACK}:{settings.port}", hub_cache(work / "hf", model)
    runs = {
        "sl": ("tinker_cookbook.recipes.sl_basic", sl_flags(args.sl_steps, args.sl_batch),
               ("train_mean_nll", "test/nll")),
        "rl": ("tinker_cookbook.recipes.rl_basic",
               rl_flags(args.rl_steps, args.rl_groups, args.rl_group_size),
               ("env/all/reward/total", "env/all/correct", "env/all/format")),
    }  # fmt: skip
    report: dict[str, Any] = {}
    try:
        for name, (module, flags, keys) in runs.items():
            if args.only not in (None, name):
                continue
            result = run_recipe(module, flags, url, settings.api_key, hf_home, work / name)
            report[name] = {"wall_s": result["wall_s"], "command": result["command"]}
            print(f"{module} ({result['wall_s']} s):")
            for key in keys:
                report[name][key] = series(result["metrics"], key)
                print(f"  {key}: {report[name][key]}")
    finally:
        server.should_exit = True
        shutil.rmtree(work, ignore_errors=True)  # the service's saves: GBs a run
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
