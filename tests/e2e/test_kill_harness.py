"""The kill harness (bench/kill_runs.py), CI-sized: a run SIGKILLed at seeded moments (the
start, rollouts, updates, checkpoint writes) leaves no process or shared-memory entry behind,
and resumed it logs each step once with the metrics and final weights of an uninterrupted run
(HF engine, tiny random Llama)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.model  # the tiny model borrows SmolLM2's tokenizer

HARNESS = Path(__file__).resolve().parents[2] / "bench" / "kill_runs.py"


@pytest.mark.timeout(1800)
def test_runs_killed_at_seeded_moments_resume_into_the_uninterrupted_run(
    smollm2_dir: Path, tmp_path: Path
) -> None:
    report = tmp_path / "kills.json"
    command = [sys.executable, str(HARNESS), "--moments", "4", "--steps", "4", "--seed", "1",
               "--out", str(tmp_path / "out"), "--json", str(report)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    moments = json.loads(report.read_text())["moments"]
    assert len(moments) == 4 and all(m["killed"] for m in moments)
    for m in moments:
        assert (m["left"], m["shm_left"]) == ([], [])
        assert m["steps_ok"] and m["data_equal"] and m["metrics_equal"] and m["weights_equal"], m
    # The seeded moments reach past the start: at least one kill found steps already logged.
    assert max(m["steps_logged"] for m in moments) >= 1
    assert "survived 4 of 4 kills" in done.stdout
