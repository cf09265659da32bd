"""The trainer's per-token logprobs land on the right trajectory and token, and round-trip through
the file the report reads."""

from __future__ import annotations

from pathlib import Path

import torch

from envhub.report.data import read_trainer_logprobs
from envhub.trainer.batch import Batch, Sample, micro_batches
from envhub.trainer.trainer_logprobs import collect, save, trainer_logprobs_path


def _batch() -> Batch:
    # Trajectory 4: 4 tokens, the last two trained; trajectory 1: 3 tokens, the middle trained.
    return Batch(
        [
            Sample([10, 11, 12, 13], [0, 0, 1, 1], [0.0] * 4, 1.0, trajectory=4),
            Sample([20, 21, 22], [0, 1, 0], [0.0] * 3, -1.0, trajectory=1),
        ]
    )


def test_collect_maps_targets_back_to_tokens_of_each_trajectory() -> None:
    batch = _batch()
    mbs = micro_batches(batch, budget=4, pad_id=0)  # one sequence per micro-batch
    assert [mb.samples for mb in mbs] == [[0], [1]]
    # Target t of a row scores token t + 1: give target t the value -(row_code + t / 10).
    values = [torch.tensor([[-1.0, -1.1, -1.2]]), torch.tensor([[-2.0, -2.1]])]
    found = collect(batch, mbs, values)
    assert found == {4: [None, None, -1.1, -1.2], 1: [None, -2.0, None]}


def test_collect_reads_each_row_of_a_shared_micro_batch() -> None:
    batch = _batch()
    (mb,) = micro_batches(batch, budget=64, pad_id=0)  # both in one right-padded micro-batch
    values = torch.tensor([[-1.0, -1.1, -1.2], [-2.0, -2.1, -9.9]])  # -9.9 sits on padding
    assert collect(batch, [mb], [values]) == {4: [None, None, -1.1, -1.2], 1: [None, -2.0, None]}


def test_saved_logprobs_are_what_the_report_reads(tmp_path: Path) -> None:
    path = trainer_logprobs_path(tmp_path, 7)
    assert path == tmp_path / "trajectories" / "trainer" / "step-000007.jsonl"
    save(path, {4: [None, -0.5], 1: [None, None, -0.25]})
    step_file = tmp_path / "trajectories" / "step-000007.jsonl"
    assert read_trainer_logprobs(step_file) == {1: [None, None, -0.25], 4: [None, -0.5]}
    assert read_trainer_logprobs(tmp_path / "trajectories" / "step-000008.jsonl") == {}
