"""What a run's checkpoint holds (trainer/checkpoint/run_state.py): the typed record, older
checkpoints' records, and a save/resume of every part through one Protocol."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from envhub.errors import CheckpointError
from envhub.trainer.checkpoint import CheckpointManager
from envhub.trainer.checkpoint.run_state import RunCheckpoints, RunState


class Part:
    """A stateful part whose state is one number (``None`` state: it keeps nothing)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def state_dict(self) -> dict[str, Any] | None:
        return None if self.value is None else {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = state["value"]


class Policy:
    """The backend's side of a checkpoint: an HF model and its optimizer."""

    def __init__(self, model_dir: Path, seed: int) -> None:
        torch.manual_seed(seed)
        config = transformers.AutoConfig.from_pretrained(model_dir)
        self.model = transformers.AutoModelForCausalLM.from_config(config)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)

    def state(self) -> dict[str, Any]:
        return {"model": self.model, "optimizer": self.optimizer, "scheduler": None}


@dataclass
class Parts:
    """A run's parts as ``RunParts`` reads them."""

    backend: Any
    schedule: Part
    producer: Part
    engine: Part
    kl_controller: Part | None = None
    critic: Any = None


def _parts(model_dir: Path, seed: int, values: tuple[Any, ...]) -> Parts:
    schedule, producer, engine, kl = (Part(v) for v in values)
    return Parts(Policy(model_dir, seed), schedule, producer, engine, kl)


def test_the_record_reads_back_as_it_was_written() -> None:
    state = RunState(step=3, schedule={"cursors": [4]}, producer={"ready": []}, engine=None)
    document = state.to_json()
    assert document == {"step": 3, "schedule": {"cursors": [4]}, "producer": {"ready": []},
                        "engine": None}  # fmt: skip
    assert RunState.from_json(json.loads(json.dumps(document)), Path("c")) == state
    with_kl = RunState(step=1, schedule={}, kl_controller={"coef": 0.5})
    assert with_kl.to_json()["kl_controller"] == {"coef": 0.5}


def test_an_older_record_without_producer_or_engine_still_resumes() -> None:
    state = RunState.from_json({"step": "2", "schedule": {"cursors": [1]}, "extra": 1}, Path("c"))
    assert state == RunState(step=2, schedule={"cursors": [1]})


def test_a_record_without_a_step_is_refused_with_what_to_do() -> None:
    with pytest.raises(CheckpointError, match=r"ckpt/trainer_state.json lacks step.*resume=never"):
        RunState.from_json({"schedule": {}}, Path("ckpt"))


def test_a_resume_restores_every_part_and_the_weights(tiny_model_dir: Path, tmp_path: Path) -> None:
    saved = _parts(tiny_model_dir, seed=1, values=(10, 20, None, 0.25))
    checkpoints = RunCheckpoints(CheckpointManager(tmp_path), saved)
    folder = checkpoints.save(4)
    on_disk = json.loads((folder / "trainer_state.json").read_text())
    assert on_disk == {
        "step": 4,
        "schedule": {"value": 10},
        "producer": {"value": 20},
        "engine": None,
        "kl_controller": {"value": 0.25},
    }

    fresh = _parts(tiny_model_dir, seed=2, values=(0, 0, "untouched", 0.0))
    resumed = RunCheckpoints(CheckpointManager(tmp_path), fresh)
    assert resumed.resume("never") == 0
    assert resumed.resume("auto") == 4
    parts = [fresh.schedule, fresh.producer, fresh.engine, fresh.kl_controller]
    # the engine kept nothing: it stays as it was
    assert [p.value for p in parts if p is not None] == [10, 20, "untouched", 0.25]
    before, after = saved.backend, fresh.backend
    for name, value in before.model.state_dict().items():
        assert torch.equal(value, after.model.state_dict()[name]), name
    assert resumed.latest() == folder


def test_a_run_with_no_checkpoint_starts_at_step_zero(tmp_path: Path) -> None:
    parts = Parts(Policy.__new__(Policy), Part(1), Part(2), Part(3))
    assert RunCheckpoints(CheckpointManager(tmp_path / "none"), parts).resume("auto") == 0
