"""The tinker cookbook's basic supervised recipe (``sl_basic``), unmodified, against the
service: run as a user runs it (``python -m tinker_cookbook.recipes.sl_basic`` with chz flags,
``TINKER_API_KEY`` in its environment), on one conversation three times over, its loss falls
step by step and its final checkpoint is the service's. bench/cookbook_recipes.py runs it and
``rl_basic`` at larger sizes and says what the flags stand in for."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

tinker = pytest.importorskip("tinker")
pytest.importorskip("tinker_cookbook")
pytest.importorskip("chz")

from tests.trainer.service.serving import Running  # noqa: E402

pytestmark = pytest.mark.model

BENCH = Path(__file__).resolve().parents[3] / "bench" / "cookbook_recipes.py"


def bench() -> Any:
    """bench/cookbook_recipes.py as a module (its flags and its offline Hub cache)."""
    spec = importlib.util.spec_from_file_location("cookbook_recipes", BENCH)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_sl_basic_runs_unmodified_and_its_loss_falls(smollm2_dir: Path, tmp_path: Path) -> None:
    recipes = bench()
    question, answer = "What is the capital of France?", "Paris is the capital."
    conversation = {"messages": [{"role": "user", "content": question},
                                 {"role": "assistant", "content": answer}]}  # fmt: skip
    data = tmp_path / "one.jsonl"
    data.write_text((json.dumps(conversation) + "\n") * 3)
    running = Running(tmp_path / "state", models=(f"{recipes.SERVED_AS}={smollm2_dir}",))
    try:
        flags = recipes.sl_flags(3, 1, data=data, held_out=0, learning_rate=1e-3)
        hf_home = recipes.hub_cache(tmp_path / "hf", str(smollm2_dir))
        key, log = running.settings.api_key, tmp_path / "log"
        result = recipes.run_recipe("tinker_cookbook.recipes.sl_basic", flags, running.url, key,
                                    hf_home, log)  # fmt: skip
        losses = recipes.series(result["metrics"], "train_mean_nll")
        assert len(losses) == 3
        assert losses[0] > losses[1] > losses[2]
        final = json.loads((log / "checkpoints.jsonl").read_text().splitlines()[-1])
        rest = tinker.RestClient(base_url=running.url, api_key=running.settings.api_key)
        run = rest.get_training_run_by_tinker_path(final["state_path"]).result()
        assert run.base_model == recipes.SERVED_AS and run.lora_rank == 8
        assert run.last_checkpoint.tinker_path == final["state_path"]
    finally:
        running.stop()
