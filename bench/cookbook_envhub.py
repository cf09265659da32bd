"""envhub envs in the tinker cookbook's RL recipe, against envhub's training service.

``tinker_cookbook.recipes.rl_basic`` runs as its own process, unmodified (flags only, as
bench/cookbook_recipes.py runs it: SmolLM2-135M served as ``meta-llama/Llama-3.2-1B``, its
tokenizer from an offline Hub cache), with its dataset swapped for
``envhub.adapters.cookbook:EnvhubDatasetBuilder`` on envhub envs, beside the cookbook's own
arithmetic env at the same sizes:

- ``cookbook-arithmetic``: the cookbook's ``ArithmeticDatasetBuilder`` (role_colon), the peer;
- ``envhub-arithmetic``: envhub's ``arithmetic`` (tiny) through the adapter (role_colon);
- ``envhub-calculator``: envhub's multi-turn tool env ``calculator`` (short problems, its
  worked example shown, at most 3 turns) through the adapter with ``qwen3_instruct`` (ChatML,
  SmolLM2's own format; the renderer shows the tools and parses the calls).

Prints per run: the reward per step (``env/all/reward/total``), turns per episode, the
adapter's share of the rollout time (``time/env_step`` + ``time/env_initial_observation``
against ``time/policy_sample``), the share of turns whose next observation extended the
sampled tokens (``token_exact``), tool calls per episode, and the wall time.

    .venv/bin/python bench/cookbook_envhub.py [--steps 4] [--groups 2] [--group-size 4]
        [--only envhub-calculator] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from envhub.defaults import LOOPBACK, free_port
from envhub.trainer.models import resolve_model
from envhub.trainer.service import ServiceSettings

_HERE = Path(__file__).resolve().parent


def _recipes() -> Any:
    """bench/cookbook_recipes.py (the service, the Hub cache, the recipe runner)."""
    spec = importlib.util.spec_from_file_location("cookbook_recipes", _HERE / "cookbook_recipes.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


RUNS: dict[str, tuple[str, dict[str, Any], str, int]] = {
    "cookbook-arithmetic": ("", {}, "role_colon", 16),
    "envhub-arithmetic": ("arithmetic", {"difficulty": "tiny"}, "role_colon", 16),
    "envhub-calculator": (
        "calculator",
        {"level": "short", "demonstration": True, "max_turns": 3},
        "qwen3_instruct",
        48,
    ),  # fmt: skip
}
"""name -> (envhub env, its args, renderer, max tokens per turn); no env: the cookbook's own."""


def flags(name: str, served_as: str, steps: int, groups: int, group_size: int) -> list[str]:
    """rl_basic's flags for run ``name``."""
    env, args, renderer, max_tokens = RUNS[name]
    b = "dataset_builder"
    if env:
        data = [f"{b}=envhub.adapters.cookbook:EnvhubDatasetBuilder", f"{b}.env={env}",
                f"{b}.env_args={json.dumps(args)}"]  # fmt: skip
    else:
        data = [f"{b}=tinker_cookbook.recipes.math_rl.arithmetic_env:ArithmeticDatasetBuilder"]
    return [
        *data, f"{b}.model_name_for_tokenizer={served_as}", f"{b}.renderer_name={renderer}",
        f"{b}.batch_size={groups}", f"{b}.group_size={group_size}", f"{b}.n_batches={steps}",
        f"max_tokens={max_tokens}", "lora_rank=8", "learning_rate=1e-4", "eval_every=0",
        "save_every=0",
    ]  # fmt: skip


def summary(result: dict[str, Any], recipes: Any) -> dict[str, Any]:
    """What one run logged, per step and in total."""
    metrics = [m for m in result["metrics"] if "env/all/reward/total" in m]

    def total(key: str) -> float:
        return sum(m.get(key, 0.0) for m in metrics)

    adapter = total("time/env_step:total") + total("time/env_initial_observation:total")
    return {
        "reward": recipes.series(metrics, "env/all/reward/total"),
        "turns_per_episode": recipes.series(metrics, "env/all/turns_per_episode"),
        "token_exact": recipes.series(metrics, "env/all/token_exact"),
        "tool_calls": recipes.series(metrics, "env/all/tool_calls"),
        "env_share_of_sampling": round(adapter / max(total("time/policy_sample:total"), 1e-9), 4),
        "seconds_per_step": round(total("time/total") / max(len(metrics), 1), 2),
        "wall_s": result["wall_s"],
    }


def main() -> None:
    """Run the recipe on each env against one service; print what each logged."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--only", choices=list(RUNS), action="append")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    recipes = _recipes()
    work = Path(tempfile.mkdtemp(prefix="envhub-cookbook-envs-"))
    model = resolve_model("smollm2-135m")
    settings = ServiceSettings(models=(f"{recipes.SERVED_AS}={model}",), device="cpu",
                               port=free_port(), state_dir=work / "state")  # fmt: skip
    server = recipes.start(settings)
    url, hf_home = f"http://{LOOPBACK}:{settings.port}", recipes.hub_cache(work / "hf", model)
    report: dict[str, Any] = {}
    try:
        for name in args.only or list(RUNS):
            run_flags = flags(name, recipes.SERVED_AS, args.steps, args.groups, args.group_size)
            result = recipes.run_recipe("tinker_cookbook.recipes.rl_basic", run_flags, url,
                                        settings.api_key, hf_home, work / name)  # fmt: skip
            report[name] = summary(result, recipes)
            print(f"{name}: {json.dumps(report[name])}", flush=True)
    finally:
        server.should_exit = True
        shutil.rmtree(work, ignore_errors=True)  # the service's saves: GBs a run
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
