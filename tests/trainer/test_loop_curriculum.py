"""The curriculum in real runs on the tiny random Llama (hf engine, CPU): a run without
``curriculum:`` trains on exactly what it did before curricula existed, and a run with one
that stops after a checkpoint and resumes draws what an uninterrupted run draws.

The golden values below were recorded with the trainer as it was before the curriculum was
added (commit 83c5460): each step's groups (id and task) and a digest of every token id, from a
3-step run of two weighted LetterEnv envs on the tiny random Llama with the hf engine, on one
torch thread (with torch's default threads on 2 shared cores the digest moved once in 5 runs).
The digests were re-recorded when the HF engine began putting a batch's rows in prompt order
rather than arrival order (arrival order follows timing and moved a step's digest in about 1
run of 5); the groups are 83c5460's, and before that change the tokens (digested as
below) matched 83c5460's in every run whose arrival order was the usual one.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from envhub.rollout.io import iter_trajectories
from envhub.testing import LetterEnv
from envhub.trainer.config import validate_config
from envhub.trainer.loop import train

pytestmark = pytest.mark.usefixtures("letter_env")

GOLDEN: list[dict[str, Any]] = [
    {
        "groups": [["s1e1g0", 4], ["s1e1g0", 4], ["s1e1g1", 1], ["s1e1g1", 1],
                   ["s1e1g2", 0], ["s1e1g2", 0]],
        "tokens": "faec24b32610921e",
    },
    {
        "groups": [["s2e0g0", 1], ["s2e0g0", 1], ["s2e1g0", 2], ["s2e1g0", 2],
                   ["s2e1g1", 5], ["s2e1g1", 5]],
        "tokens": "2ef651665f87be80",
    },
    {
        "groups": [["s3e0g0", 0], ["s3e0g0", 0], ["s3e1g0", 3], ["s3e1g0", 3],
                   ["s3e1g1", 0], ["s3e1g1", 0]],
        "tokens": "fb94681417e71d94",
    },
]  # fmt: skip


def _config(model_dir: Path, out: Path, **extra: Any) -> dict[str, Any]:
    return extra | {
        "steps": 3,
        "seed": 5,
        "model": {"name": str(model_dir)},
        "envs": [{"name": LetterEnv.name}, {"name": LetterEnv.name, "weight": 2.0}],
        "rollout": {"tasks_per_step": 3, "samples_per_task": 2, "max_tokens": 6},
        "algorithm": {"mismatch": "none"},
        "optimizer": {"lr": 1e-3},
        "backend": {"device": "cpu", "micro_batch_tokens": 128, "threads": 1},
        "logging": {"output_dir": str(out), "run_name": "run", "plot": False},
        "checkpoint": {"every": 10, "export_hf": False},
    }


def _steps(run: Path) -> list[dict[str, Any]]:
    """Each step's groups (id, task) and a digest of all its token ids, in file order; a group's
    samples are exchangeable (the same prompt), so their token lists enter the digest sorted."""
    rows = []
    for path in sorted((run / "trajectories").glob("step-*.jsonl")):
        trajectories = list(iter_trajectories(path))
        groups: dict[str, list[list[int]]] = {}
        for t in trajectories:
            groups.setdefault(t.group_id, []).append(list(t.token_ids))
        tokens = json.dumps([sorted(samples) for samples in groups.values()]).encode()
        rows.append({
            "groups": [[t.group_id, t.task_index] for t in trajectories],
            "tokens": hashlib.sha256(tokens).hexdigest()[:16],
        })  # fmt: skip
    return rows


def test_a_run_without_a_curriculum_draws_and_samples_as_before(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    train(validate_config(_config(tiny_model_dir, tmp_path)))
    assert _steps(tmp_path / "run") == GOLDEN


def _curriculum_rows(run: Path) -> list[dict[str, float]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k.startswith("curriculum/")} for r in rows]


def test_a_run_with_a_curriculum_resumed_from_a_checkpoint_draws_as_an_uninterrupted_one(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    # LetterEnv's reward (the share of e's) never reaches its pass threshold of 1: after one
    # group every task is hopeless, and only revisits (half of them) or forced draws bring it.
    curriculum = {"revisit": 0.5, "window": 2}
    straight = _config(tiny_model_dir, tmp_path / "a", curriculum=curriculum)
    train(validate_config(straight | {"steps": 5}))
    stopped = _config(tiny_model_dir, tmp_path / "b", curriculum=curriculum)
    stopped["checkpoint"] = {"every": 2, "export_hf": False}
    train(validate_config(stopped | {"steps": 3}))  # checkpoints after steps 2 and 3
    state = json.loads((tmp_path / "b/run/checkpoints/step-000003/trainer_state.json").read_text())[
        "schedule"
    ]
    stats = state["curriculum"]["stats"]  # [env, level, task, recent pass rates]
    assert len(stats) == 8 and all(rates and set(rates) == {0.0} for *_, rates in stats)
    result = train(validate_config(stopped | {"steps": 5}))
    assert result.resumed_from == 3
    a, b = _steps(tmp_path / "a" / "run"), _steps(tmp_path / "b" / "run")
    assert [s["groups"] for s in a] == [s["groups"] for s in b]
    assert _curriculum_rows(tmp_path / "a" / "run") == _curriculum_rows(tmp_path / "b" / "run")
    rows = _curriculum_rows(tmp_path / "a" / "run")
    assert all(r["curriculum/drawn"] == 3.0 for r in rows)
    assert sum(r["curriculum/skipped"] for r in rows) > 0
