"""``envhub train`` on repo-repair on the CPU: two steps end to end (a tiny random model, the
torch backend, episodes in real sandbox sessions scored by pytest), recorded honestly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envhub.rollout.io import read_trajectories
from envhub.sandbox import bwrap_problem

pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(
    bwrap_problem() is not None or os.geteuid() != 0,
    reason="local sessions need bubblewrap and root",
)
ROOT = Path(__file__).resolve().parents[2]
CONFIG = """\
steps: 2
seed: 0
model: {{name: {model}}}
envs:
  - name: repo-repair
    args: {{seeds: [0], difficulties: [1], max_turns: 2}}
rollout: {{tasks_per_step: 1, samples_per_task: 2, max_tokens: 8, temperature: 1.0}}
backend: {{device: cpu}}
logging: {{output_dir: {out}, run_name: repo}}
"""


def test_two_cpu_steps_on_repo_repair(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = tmp_path / "repo.yaml"
    config.write_text(CONFIG.format(model=tiny_model_dir, out=tmp_path))
    done = subprocess.run(
        [sys.executable, "-m", "envhub.cli", "train", str(config)],
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert "on repo-repair: 2 steps x 1 tasks x 2 samples" in done.stdout
    run = tmp_path / "repo"
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [1, 2]
    for step in (1, 2):
        trajectories = read_trajectories(run / "trajectories" / f"step-{step:06d}.jsonl")
        assert len(trajectories) == 2
        for t in trajectories:  # random tokens fix nothing: the buggy suite's score, recorded
            assert (t.outcome, t.reward, t.errors) == ("ok", 0.0, [])
            assert t.reward_components == {"verifier": 0.0, "tests_passed": 1 / 3}
            assert t.token_ids and sum(t.loss_mask) > 0
    assert (run / "final" / "model.safetensors").exists()
