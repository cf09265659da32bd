"""Rollouts in Ray actors (``rollout.workers``) on a real local Ray cluster, without vLLM: the
workers produce the trajectories the driver produces (same groups, ids, seeds, rewards), in the
workers' processes; a failing episode stays data; a worker that dies ends the step with an error
naming it. The end-to-end run against a real vLLM server is in ``test_loop_vllm.py``.

Ray starts once for the module. The envs and the policy below are defined here, in a module
Ray's worker processes cannot import by name, so the module is registered with
``ray.cloudpickle.register_pickle_by_value``: Ray ships their code to the workers.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

import envhub  # noqa: E402
from envhub import registry  # noqa: E402
from envhub.errors import ConfigError, WorkerDiedError  # noqa: E402
from envhub.state import State  # noqa: E402
from envhub.testing import ByteChatTokenizer, LetterEnv, ScriptedEngine  # noqa: E402
from envhub.trainer.cluster.run import ray_cpus  # noqa: E402
from envhub.trainer.config import load_config, validate_config  # noqa: E402
from envhub.trainer.engines.base import RolloutEngine  # noqa: E402
from envhub.trainer.rollout_jobs import RolloutJob, RunnerOptions  # noqa: E402
from envhub.trainer.rollout_workers import (  # noqa: E402
    Part,
    RolloutWorkers,
    deal,
    forwarded_env,
    merge_stats,
    stats_since,
)
from envhub.types import Trajectory  # noqa: E402

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"


class PidLetterEnv(LetterEnv):
    """LetterEnv that records the process its episode ran in (metric ``pid``)."""

    name = "test-letters-pid"

    async def setup_state(self, state: State) -> None:
        state.metrics["pid"] = os.getpid()


class BrokenEnv(LetterEnv):
    """Every reset raises: a bad rollout, recorded on the trajectory."""

    name = "test-broken-reset"

    async def setup_state(self, state: State) -> None:
        raise ValueError("no such task")


class ExitEnv(LetterEnv):
    """Every reset ends its process, as a crashing sandbox or an OOM kill would."""

    name = "test-exit"

    async def setup_state(self, state: State) -> None:
        os._exit(3)


ENVS = [PidLetterEnv, BrokenEnv, ExitEnv]


def echo(messages: list[Any], tools: Any) -> str:
    """A deterministic policy: the answer depends on the prompt only."""
    return "eee " + (messages[-1].content or "")[:12]


def _engine() -> ScriptedEngine:
    return ScriptedEngine(echo, ByteChatTokenizer())


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=4, num_gpus=0, include_dashboard=False, log_to_driver=False)
    for env in ENVS:
        envhub.register(env.name, env, override=True)
    yield
    for env in ENVS:
        registry._registered.pop(env.name, None)
    ray.shutdown()
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def _config(*envs: dict[str, Any], tasks: int = 5) -> Any:
    return validate_config({
        "seed": 11,
        "envs": list(envs),
        "rollout": {"tasks_per_step": tasks, "samples_per_task": 2, "max_tokens": 16,
                    "max_concurrency": 3},
    })  # fmt: skip


class Progress:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def start(self, config: Any, info: dict[str, Any]) -> None: ...

    def rollout_progress(self, done: int, total: int) -> None:
        self.calls.append((done, total))

    def step(self, step: int, metrics: dict[str, float]) -> None: ...

    def finish(self, result: Any) -> None: ...


class Versioned(RolloutEngine):
    """The scripted engine as the trainer's engine: it samples the policy of ``version``."""

    def __init__(self, version: int) -> None:
        self.inner = _engine()
        self.tokenizer = self.inner.tokenizer
        self.weights_version = version

    async def generate(self, request: Any) -> Any:
        return await self.inner.generate(request)

    async def describe(self) -> Any:
        return await self.inner.describe()  # the same sampler as the workers' own engines


def _rollout(
    config: Any, step: int, workers: RolloutWorkers | None
) -> tuple[list[Trajectory], Progress]:
    """Step ``step``'s episodes as the synchronous loop gets them (``max_staleness`` 0)."""
    from envhub.trainer.producer import GroupProducer
    from envhub.trainer.tasks import TaskSchedule

    schedule = TaskSchedule.from_specs(config.envs, config.seed)
    for earlier in range(step):
        schedule.draw(earlier, config.rollout.tasks_per_step)
    progress = Progress()

    async def take() -> list[Trajectory]:
        producer = GroupProducer(
            config, schedule, Versioned(step), workers, progress.rollout_progress
        )
        producer.start(first_draw=step)
        try:
            return (await producer.take(step)).trajectories
        finally:
            await producer.aclose()

    return asyncio.run(take()), progress


def _comparable(t: Trajectory) -> dict[str, Any]:
    data = t.model_dump(exclude={"seconds"})
    data["metrics"].pop("pid", None)
    for turn in data["turns"]:
        turn.pop("generate_seconds", None)
        turn.pop("env_seconds", None)
    return data


# -- dealing, stats, pickling -----------------------------------------------------------------


def test_groups_are_dealt_round_robin_across_jobs() -> None:
    jobs = [
        RolloutJob(0, (7, 3, 5), seed=1, prefix="s1e0"),
        RolloutJob(2, (4, 4), seed=2, prefix="s1e2"),
    ]

    shares = deal(jobs, 2)

    assert shares == [
        [
            Part(0, RolloutJob(0, (7, 5), seed=1, prefix="s1e0"), [0, 2]),
            Part(1, RolloutJob(2, (4,), seed=2, prefix="s1e2"), [1]),
        ],
        [
            Part(0, RolloutJob(0, (3,), seed=1, prefix="s1e0"), [1]),
            Part(1, RolloutJob(2, (4,), seed=2, prefix="s1e2"), [0]),
        ],
    ]
    assert deal(jobs, 4)[3] == [Part(1, RolloutJob(2, (4,), seed=2, prefix="s1e2"), [0])]
    assert deal(jobs, 6)[5] == []


def test_engine_counters_add_up_and_the_mean_request_time_is_weighted() -> None:
    merged = merge_stats([
        {"generated_tokens": 30.0, "requests": 3.0, "seconds_per_request": 1.0},
        {"generated_tokens": 10.0, "requests": 1.0, "seconds_per_request": 5.0},
    ])  # fmt: skip

    assert merged == {"generated_tokens": 40.0, "requests": 4.0, "seconds_per_request": 2.0}
    assert merge_stats([{"requests": 0.0, "seconds_per_request": 0.0}]) == {
        "requests": 0.0,
        "seconds_per_request": 0.0,
    }
    assert merge_stats([]) == {}


def test_counters_between_two_reads_of_running_totals() -> None:
    # a worker's totals after step 1 (3 requests, 1 s each) and after step 2 (2 more, 2.5 s
    # each): step 2 had 2 requests of 2.5 s on average, 20 tokens, 2 of them on engine 1
    before = {
        "generated_tokens": 30.0,
        "requests": 3.0,
        "seconds_per_request": 1.0,
        "requests_engine0": 2.0,
        "requests_engine1": 1.0,
    }
    now = {"generated_tokens": 50.0, "requests": 5.0, "seconds_per_request": 1.6,
           "requests_engine0": 2.0, "requests_engine1": 3.0}  # fmt: skip

    since = stats_since(now, before)

    assert since == pytest.approx({
        "generated_tokens": 20.0, "requests": 2.0, "seconds_per_request": 2.5,
        "requests_engine0": 0.0, "requests_engine1": 2.0,
    })  # fmt: skip
    assert stats_since(now, {}) == now  # the first read: everything so far
    assert stats_since(now, now)["seconds_per_request"] == 0.0  # no request in between


def test_workers_get_the_drivers_credentials_and_envhub_settings() -> None:
    environ = {
        "E2B_API_KEY": "k",
        "HF_TOKEN": "t",
        "ENVHUB_CACHE": "/c",
        "OPENAI_API_KEY": "o",
        "HOME": "/root",
        "PATH": "/bin",
    }
    assert forwarded_env(environ) == {
        "E2B_API_KEY": "k",
        "HF_TOKEN": "t",
        "ENVHUB_CACHE": "/c",
        "OPENAI_API_KEY": "o",
    }


def test_trajectories_and_jobs_survive_pickling(cluster: None) -> None:
    config = _config({"name": PidLetterEnv.name}, tasks=1)
    trajectory = _rollout(config, 0, None)[0][0]
    job = RolloutJob(0, (1, 2), seed=3, prefix="s1e0")
    options = RunnerOptions.from_config(config.rollout)

    assert trajectory.token_ids and trajectory.turns
    for dumps, loads in ((pickle.dumps, pickle.loads), (ray.cloudpickle.dumps, pickle.loads)):
        assert loads(dumps(trajectory)) == trajectory
        assert loads(dumps(job)) == job
        assert loads(dumps(options)) == options


# -- real workers -------------------------------------------------------------------------------


def test_workers_give_the_trajectories_the_driver_gives_from_their_own_processes(
    cluster: None,
) -> None:
    config = _config(
        {"name": PidLetterEnv.name},
        {"name": "arithmetic", "args": {"difficulty": "tiny"}, "weight": 2.0},
    )
    workers = RolloutWorkers(2, _engine, config.envs)
    try:
        here, here_progress = _rollout(config, 1, None)
        there, there_progress = _rollout(config, 1, workers)
    finally:
        asyncio.run(workers.aclose())

    assert [_comparable(t) for t in there] == [_comparable(t) for t in here]
    assert len({t.group_id for t in there}) == 5 and all(
        t.group_id.startswith("s2e") for t in there
    )
    assert sorted({t.env.name for t in there}) == ["arithmetic", PidLetterEnv.name]
    pids = {int(t.metrics["pid"]) for t in there if "pid" in t.metrics}
    assert pids == {w["pid"] for w in workers.info} and len(pids) == 2 and os.getpid() not in pids
    assert {int(t.metrics["pid"]) for t in here if "pid" in t.metrics} == {os.getpid()}
    assert here_progress.calls[-1] == there_progress.calls[-1] == (10, 10)
    assert [done for done, _ in there_progress.calls] == sorted(
        {done for done, _ in there_progress.calls}
    )


def test_workers_here_run_on_the_cores_the_core_split_gives_the_engine(cluster: None) -> None:
    last = max(os.sched_getaffinity(0))
    config = _config({"name": PidLetterEnv.name})
    pinned = RolloutWorkers(2, _engine, config.envs, here_only=True, cores=(last,))
    free = RolloutWorkers(1, _engine, config.envs, here_only=False, cores=(last,))  # not here
    try:
        assert [os.sched_getaffinity(w["pid"]) for w in pinned.info] == [{last}, {last}]
        assert os.sched_getaffinity(free.info[0]["pid"]) == os.sched_getaffinity(0)
    finally:
        asyncio.run(pinned.aclose())
        asyncio.run(free.aclose())


def test_a_failing_episode_in_a_worker_is_recorded_and_the_step_goes_on(cluster: None) -> None:
    config = _config({"name": BrokenEnv.name})
    workers = RolloutWorkers(2, _engine, config.envs)
    try:
        trajectories, _ = _rollout(config, 0, workers)
    finally:
        asyncio.run(workers.aclose())

    assert len(trajectories) == 10
    assert {(e.stage, e.type, e.message) for t in trajectories for e in t.errors} == {
        ("env.reset", "ValueError", "no such task")
    }


def test_a_worker_that_dies_ends_the_step_naming_it_and_its_node(cluster: None) -> None:
    config = _config({"name": PidLetterEnv.name}, {"name": ExitEnv.name})
    workers = RolloutWorkers(2, _engine, config.envs)
    node = ray.util.get_node_ip_address()
    try:
        with pytest.raises(
            WorkerDiedError, match=rf"^rollout worker [01] on node {node} died: "
        ) as caught:
            _rollout(config, 0, workers)
    finally:
        asyncio.run(workers.aclose())
        asyncio.run(workers.aclose())  # idempotent

    assert caught.value.node == node and caught.value.worker in (0, 1)
    assert ray.is_initialized()  # a Ray it did not start is left running


def test_a_loop_step_lost_to_a_dead_worker_says_how_to_resume(
    cluster: None, tmp_path: Path
) -> None:
    from envhub.trainer.loop import STEP_LOST, _stopped

    error = WorkerDiedError(
        "rollout worker 1 on node 10.0.0.2 died: SYSTEM_ERROR: exit code 3",
        worker=1,
        node="10.0.0.2",
    )
    stopped = _stopped(error, 4, tmp_path / "step-000004")

    assert isinstance(error, STEP_LOST) and isinstance(stopped, WorkerDiedError)
    assert str(stopped).endswith(
        "Training stopped in step 5: "
        f"rerun the same command to resume from {tmp_path / 'step-000004'}."
    )
    assert (stopped.worker, stopped.node) == (1, "10.0.0.2")


# -- config ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["rollout.workers=2"],
            "rollout.workers runs episodes in Ray actors that reach vLLM over HTTP: "
            "set rollout.engine=vllm",
        ),
        (
            ["rollout.workers=2", "rollout.engine=vllm", "rollout.vllm.mode=inprocess"],
            "rollout.workers needs a vLLM server the actors can reach: "
            "set rollout.vllm.mode=server",
        ),
        (["rollout.workers=-1"], "rollout.workers: Input should be greater than or equal to 0"),
    ],
)
def test_invalid_worker_configs_fail_before_any_work(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(EXAMPLES_DIR / "quickstart.yaml", overrides)
    assert message in str(info.value)


def test_workers_with_a_vllm_server_are_valid_and_reserve_a_cpu_each() -> None:
    assert load_config(EXAMPLES_DIR / "quickstart.yaml").rollout.workers == 0
    config = load_config(
        EXAMPLES_DIR / "quickstart.yaml", ["rollout.workers=3", "rollout.engine=vllm"]
    )

    assert config.rollout.workers == 3
    assert ray_cpus(config) == 3
    assert ray_cpus(load_config(EXAMPLES_DIR / "quickstart.yaml", ["rollout.engine=vllm"])) == 0


def test_envs_registered_here_are_registered_in_the_workers_by_target(cluster: None) -> None:
    from envhub.trainer.rollout_workers import _registrations

    specs = _config({"name": PidLetterEnv.name}, {"name": "arithmetic"}).envs

    assert _registrations(specs) == {PidLetterEnv.name: PidLetterEnv}  # arithmetic is installed
