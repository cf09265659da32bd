"""The heartbeat of a training step off a terminal: what its line says and when it is due, on a
clock the test moves; and that a terminal, which has the progress bar, gets none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from envhub.cli import train_view
from envhub.cli.heartbeat import Heartbeat
from envhub.trainer.config import validate_config


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def beat(every: float = 10.0) -> tuple[Heartbeat, Clock]:
    clock = Clock()
    return Heartbeat(every, 10, print, clock=clock), clock


def test_a_line_says_the_step_phase_progress_and_seconds() -> None:
    heartbeat, clock = beat()
    heartbeat.finish_step(2)
    clock.now += 1
    heartbeat.enter("rollout")
    heartbeat.progress(12, 32)
    clock.now += 18
    assert heartbeat.line() == "step 3/10: rolling out 12/32 episodes, 18 s"
    heartbeat.enter("update")
    clock.now += 22
    assert heartbeat.line() == "step 3/10: updating the policy, 40 s"
    heartbeat.finish_step(3)
    heartbeat.enter("checkpoint")
    clock.now += 5
    assert heartbeat.line() == "step 3/10: saving a checkpoint, 5 s"  # the step it saves


def test_a_line_is_due_every_interval_of_silence() -> None:
    heartbeat, clock = beat(every=10.0)
    heartbeat.finish_step(0)
    heartbeat.enter("rollout")
    clock.now += 9.9
    assert heartbeat.due() is None
    clock.now += 0.1
    assert heartbeat.due() == "step 1/10: rolling out, 10 s"
    clock.now += 5
    assert heartbeat.due() is None  # 5 s since the last line
    clock.now += 5
    assert heartbeat.due() == "step 1/10: rolling out, 20 s"
    heartbeat.finish_step(1)  # the step's row is output too
    clock.now += 9
    assert heartbeat.due() is None


def test_the_thread_stops_and_stopping_twice_is_fine() -> None:
    heartbeat, _ = beat()
    heartbeat.start()
    heartbeat.stop()
    heartbeat.stop()
    assert heartbeat._thread is None


def _started(monkeypatch: Any, terminal: bool, **logging: Any) -> train_view.RichReporter:
    monkeypatch.setattr(train_view, "console", Console(force_terminal=terminal, width=120))
    config = validate_config({"envs": [{"name": "arithmetic"}], "logging": logging})
    reporter = train_view.RichReporter()
    info = {"run_dir": "r", "parameters": 1e6, "device": "cpu"}
    reporter.start(config, info)
    return reporter


def test_only_output_that_is_not_a_terminal_gets_a_heartbeat(
    monkeypatch: Any, tmp_path: Path
) -> None:
    from envhub.trainer.loop import RunResult

    piped = _started(monkeypatch, terminal=False)
    assert piped.heartbeat is not None and piped.heartbeat.every == 15.0
    piped.finish(RunResult(run_dir=tmp_path, history=[]))
    assert piped.heartbeat._thread is None
    assert _started(monkeypatch, terminal=True).heartbeat is None
    assert _started(monkeypatch, terminal=False, heartbeat_seconds=None).heartbeat is None
