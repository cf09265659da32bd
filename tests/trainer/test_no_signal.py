"""A run that trains on nothing says so on every such step (the reason in full on the first)
and stops after a few."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from envhub.cli.console import console
from envhub.cli.train_view import RichReporter, never_learned
from envhub.errors import NoLearningSignalError
from envhub.trainer.batch import COLD_START, NoSignal
from envhub.trainer.config import validate_config
from envhub.trainer.loop import train
from envhub.trainer.no_signal import EmptySteps

TIED = NoSignal("every group's rewards are tied (2 groups at 0), so every advantage is 0", False)
SOLVED = NoSignal("every group's rewards are tied (2 groups at 1), so every advantage is 0", True)


def test_every_empty_step_warns_and_the_limit_stops(caplog: pytest.LogCaptureFixture) -> None:
    # What a user saw: "trained on nothing" on one step, and nothing on the next, also empty.
    watch = EmptySteps(limit=3)
    with caplog.at_level(logging.WARNING, logger="envhub.trainer.no_signal"):
        watch.observe(1, None)
        watch.observe(2, TIED)
        watch.observe(3, TIED)
        with pytest.raises(NoLearningSignalError) as stopped:
            watch.observe(4, TIED)
    assert [r.getMessage() for r in caplog.records] == [
        f"step 2 trained on nothing: {TIED.reason}",
        "step 3 trained on nothing again: 2 steps in a row, the run stops at 3 (same reason)",
    ]
    assert str(stopped.value).startswith(
        f"stopped after 3 steps in a row with nothing to learn from (steps 2-4): {TIED.reason}. "
        "Check that the env can reward this model"
    )
    assert "algorithm.max_empty_steps: null" in str(stopped.value)


def test_a_new_reason_or_a_new_streak_is_said_in_full(caplog: pytest.LogCaptureFixture) -> None:
    failed = NoSignal("none of the 4 episodes is trainable (failed, or no tokens)", False)
    watch = EmptySteps(limit=None)
    with caplog.at_level(logging.WARNING, logger="envhub.trainer.no_signal"):
        for step, empty in enumerate([TIED, TIED, failed, None, TIED], start=1):
            watch.observe(step, empty)
    assert [r.getMessage() for r in caplog.records] == [
        f"step 1 trained on nothing: {TIED.reason}",
        "step 2 trained on nothing again: 2 steps in a row (same reason)",
        f"step 3 trained on nothing: {failed.reason}",
        f"step 5 trained on nothing: {TIED.reason}",
    ]


def test_a_step_with_signal_restarts_the_count() -> None:
    watch = EmptySteps(limit=2)
    for step, empty in enumerate([TIED, None, TIED, None, TIED], start=1):
        watch.observe(step, empty)
    assert watch.streak == 1


def test_solved_steps_never_stop_the_run_and_each_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    watch = EmptySteps(limit=1)
    with caplog.at_level(logging.WARNING, logger="envhub.trainer.no_signal"):
        for step in range(1, 4):
            watch.observe(step, SOLVED)
    assert [r.getMessage() for r in caplog.records] == [
        "step 1: every episode passed, nothing to learn from",
        "step 2: every episode passed again (2 steps in a row), nothing to learn from",
        "step 3: every episode passed again (3 steps in a row), nothing to learn from",
    ]


def test_no_limit_never_stops() -> None:
    watch = EmptySteps(limit=None)
    for step in range(1, 50):
        watch.observe(step, TIED)
    assert watch.streak == 49


def _config(model_dir: Path, out: Path, **algorithm: object) -> dict:
    # A random 2-layer model never writes a boxed number: every arithmetic reward is 0.
    return {
        "steps": 6,
        "seed": 0,
        "model": {"name": str(model_dir)},
        "envs": [{"name": "arithmetic", "args": {"num_tasks": 20}}],
        "rollout": {"tasks_per_step": 2, "samples_per_task": 2, "max_tokens": 4},
        "algorithm": {"mismatch": "none", **algorithm},
        "backend": {"device": "cpu"},
        "logging": {"output_dir": str(out), "run_name": "run", "plot": False},
    }


def test_a_run_on_an_env_that_never_rewards_stops_and_says_why(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # What a user saw: every step "kept 0", no loss, and the run ended with "done" and final/.
    config = validate_config(_config(tiny_model_dir, tmp_path))
    with (
        caplog.at_level(logging.WARNING, logger="envhub.trainer.no_signal"),
        pytest.raises(NoLearningSignalError) as stopped,
    ):
        train(config)
    reason = "every group's rewards are tied (2 groups at 0), so every advantage is 0"
    assert str(stopped.value).startswith(
        f"stopped after 3 steps in a row with nothing to learn from (steps 1-3): {reason}."
    )
    assert f"{reason}. No episode passed, so RL has nothing to reinforce: show the" in str(
        stopped.value
    )
    assert [r.getMessage() for r in caplog.records] == [
        f"step 1 trained on nothing: {reason}; {COLD_START}",
        "step 2 trained on nothing again: 2 steps in a row, the run stops at 3 (same reason)",
    ]
    lines = (config.run_dir / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert [(r["step"], r["batch/kept"]) for r in rows] == [(1, 0.0), (2, 0.0), (3, 0.0)]
    assert not (config.run_dir / "final").exists()


def test_max_empty_steps_null_lets_the_run_go_on_and_its_end_says_nothing_was_learned(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    config = validate_config(_config(tiny_model_dir, tmp_path, max_empty_steps=None) | {"steps": 4})
    result = train(config)
    assert [(r["batch/kept"], r["train/no_signal"]) for r in result.history] == [(0.0, 1.0)] * 4
    assert (config.run_dir / "final").exists()
    # What a user saw: "final model:" as if it had trained.
    with console.capture() as captured:
        RichReporter().finish(result)
    text = " ".join(captured.get().split())
    assert (
        "nothing learned: each of the 4 steps trained on nothing, so the weights never changed; "
        "no episode passed, so RL had nothing to reinforce: show the model how first, with a "
        "warm start (sft:) or a teacher (distill:)"
    ) in text
    assert f"final model (the starting weights): {config.run_dir / 'final'}" in text


def test_the_end_of_a_run_that_learned_at_all_says_nothing_of_the_kind() -> None:
    tied = {"reward/mean": 1.0, "pass@1": 1.0, "train/no_signal": 1.0}
    assert never_learned([{"step": 1, "reward/mean": 0.5}, {"step": 2, **tied}]) is None
    assert never_learned([{"step": 1, "sft/epoch": 1.0}, {"step": 2, **tied}]) is None
    assert never_learned([]) is None
    assert never_learned([{"step": 1, **tied}, {"step": 2, **tied}]) == (
        "[bold yellow]nothing learned[/]: each of the 2 steps trained on nothing, so the weights "
        "never changed; the warnings above say why for each step"
    )
