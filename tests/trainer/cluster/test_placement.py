"""WorkerGroup on a real local Ray cluster: rank environment, a gloo all_reduce, failures.

Ray starts once for the module (it takes seconds). The probe worker below is defined here, in a
module Ray's worker processes cannot import by name, so the module is registered with
``ray.cloudpickle.register_pickle_by_value``: Ray ships the class's code itself to each rank.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("torch")

from envhub.errors import (  # noqa: E402
    ConfigError,
    MissingDependencyError,
    PlacementError,
    WorkerDiedError,
    WorkerError,
    WorkerGroupClosedError,
)
from envhub.trainer.cluster.placement import Placement, WorkerGroup, rank_env  # noqa: E402
from envhub.trainer.cluster.ray_runtime import LOCAL_SYSTEM_CONFIG  # noqa: E402

ENV_KEYS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PROBE",
)


class Probe:
    """A trainer worker that reports, reduces, raises or dies on request."""

    def __init__(self, distributed: bool = False, fail: str | None = None) -> None:
        if fail:
            raise ValueError(fail)
        if distributed:
            import torch.distributed as dist

            dist.init_process_group("gloo", init_method="env://")

    def env(self) -> dict[str, str | None]:
        return {key: os.environ.get(key) for key in ENV_KEYS}

    def all_reduce(self, value: int) -> int:
        import torch
        import torch.distributed as dist

        tensor = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(tensor)
        return int(tensor.item())

    def fail_on(self, rank: int, message: str) -> str:
        if int(os.environ["RANK"]) == rank:
            raise ValueError(message)
        return "ok"

    def die_on(self, rank: int) -> int:
        if int(os.environ["RANK"]) == rank:
            os._exit(1)
        return self.all_reduce(1)

    def raise_then_die(self, delay: float) -> None:
        if os.environ["RANK"] == "0":
            raise RuntimeError("peer connection closed")
        time.sleep(delay)
        os._exit(1)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A local Ray cluster (4 logical CPUs) for the module; yields the node IP."""
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(
        num_cpus=4,
        num_gpus=0,
        include_dashboard=False,
        log_to_driver=False,
        _system_config=LOCAL_SYSTEM_CONFIG,  # as envhub's own local clusters
    )
    yield ray.util.get_node_ip_address()
    ray.shutdown()
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def gloo_group(cluster: str) -> Iterator[WorkerGroup]:
    with WorkerGroup(
        Probe, Placement(world_size=2), env={"PROBE": "yes"}, kwargs={"distributed": True}
    ) as group:
        yield group


def _wait_gone(pids: list[int], seconds: float = 20.0) -> list[int]:
    """The pids still alive after waiting up to `seconds` for them to exit."""
    deadline = time.monotonic() + seconds
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [pid for pid in alive if os.path.exists(f"/proc/{pid}") and "Z" not in _state(pid)]
    return alive


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "Z"


def test_each_rank_gets_its_environment(gloo_group: WorkerGroup, cluster: str) -> None:
    envs = gloo_group.call("env")
    port = envs[0]["MASTER_PORT"]
    assert port is not None and port.isdigit()
    assert envs == [
        {
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": cluster,
            "MASTER_PORT": port,
            "PROBE": "yes",
        }
        for rank in (0, 1)
    ]


def test_gloo_all_reduce_sums_across_ranks(gloo_group: WorkerGroup) -> None:
    assert gloo_group.call_ranks("all_reduce", [(10,), (32,)]) == [42, 42]
    assert gloo_group.call("all_reduce", 5, timeout=60) == [10, 10]


def test_ranks_info_names_node_and_process(gloo_group: WorkerGroup, cluster: str) -> None:
    info = gloo_group.ranks_info()
    assert [(i["rank"], i["node"]) for i in info] == [(0, cluster), (1, cluster)]
    pids = [i["pid"] for i in info]
    assert len(set(pids)) == 2 and os.getpid() not in pids
    assert all(os.path.exists(f"/proc/{pid}") for pid in pids)


def test_bad_calls_leave_the_group_usable(gloo_group: WorkerGroup) -> None:
    with pytest.raises(AttributeError, match="^Probe has no method 'nope'$"):
        gloo_group.call("nope")
    with pytest.raises(ValueError, match="^per_rank_args has 1 entries for 2 ranks$"):
        gloo_group.call_ranks("all_reduce", [(1,)])
    assert gloo_group.call("all_reduce", 1) == [2, 2]


def test_an_exception_in_a_rank_names_it_and_closes_the_group(cluster: str) -> None:
    group = WorkerGroup(Probe, Placement(world_size=2))
    pids = [i["pid"] for i in group.ranks_info()]
    with pytest.raises(WorkerError) as caught:
        group.call("fail_on", 1, "bad batch 7")
    message = f"trainer rank 1 on node {cluster} failed in fail_on: ValueError: bad batch 7"
    assert str(caught.value) == message
    assert type(caught.value) is WorkerError
    assert (caught.value.worker, caught.value.node) == (1, cluster)
    assert isinstance(caught.value.__cause__, ray.exceptions.RayTaskError)
    assert _wait_gone(pids) == []
    with pytest.raises(WorkerGroupClosedError) as closed:
        group.call("env")
    assert str(closed.value) == (
        f"the worker group is closed ({message}); "
        "start a new WorkerGroup (and resume from the last checkpoint)"
    )
    group.shutdown()


def test_a_dead_rank_is_reported_while_its_peer_waits_in_a_collective(cluster: str) -> None:
    group = WorkerGroup(Probe, Placement(world_size=2), kwargs={"distributed": True})
    started = time.monotonic()
    with pytest.raises(WorkerDiedError) as caught:
        group.call("die_on", 1)
    assert time.monotonic() - started < 60  # a few seconds; a peer stuck in gloo waits 30 min
    assert (caught.value.worker, caught.value.node) == (1, cluster)
    assert str(caught.value).startswith(f"trainer rank 1 on node {cluster} died: SYSTEM_ERROR: ")
    with pytest.raises(
        WorkerGroupClosedError, match=r"^the worker group is closed \(trainer rank 1 on node "
    ):
        group.ranks_info()
    group.shutdown()


class Neighbour:
    """An actor placed in a rank's bundle by someone else (as a colocated vLLM engine is)."""

    def pid(self) -> int:
        return os.getpid()


def test_a_failed_group_keeps_its_bundles_until_shutdown_for_the_actors_placed_in_them(
    cluster: str,
) -> None:
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    live = _live_placement_groups()
    group = WorkerGroup(Probe, Placement(world_size=2), kwargs={"distributed": True})
    in_bundle = PlacementGroupSchedulingStrategy(group.placement_group, 0)
    neighbour = ray.remote(Neighbour).options(num_cpus=0, scheduling_strategy=in_bundle).remote()
    pid = ray.get(neighbour.pid.remote())
    with pytest.raises(WorkerDiedError):
        group.call("die_on", 1)

    # its owner can still stop it cleanly (a vLLM server with its whole process group)
    assert ray.get(neighbour.pid.remote(), timeout=10) == pid
    assert _live_placement_groups() == live + 1
    group.shutdown()
    assert _live_placement_groups() == live
    assert _wait_gone([pid]) == []  # removing the bundles killed it


def test_a_death_right_after_an_exception_is_reported_as_the_cause(cluster: str) -> None:
    group = WorkerGroup(Probe, Placement(world_size=2))
    with pytest.raises(WorkerDiedError) as caught:
        group.call("raise_then_die", 0.2)
    assert caught.value.worker == 1
    assert str(caught.value).endswith(" (then also rank 0: RuntimeError: peer connection closed)")
    group.shutdown()


def test_a_timeout_closes_the_group(cluster: str) -> None:
    group = WorkerGroup(Probe, Placement(world_size=2))
    with pytest.raises(TimeoutError) as caught:
        group.call("sleep", 60, timeout=0.5)
    assert (
        str(caught.value)
        == "trainer ranks [0, 1] did not finish sleep within 0.5 s; the group is closed"
    )
    with pytest.raises(WorkerGroupClosedError):
        group.call("env")
    group.shutdown()


def _live_placement_groups() -> int:
    return sum(pg["state"] != "REMOVED" for pg in ray.util.placement_group_table().values())


def test_a_failing_constructor_fails_the_group_and_frees_its_resources(cluster: str) -> None:
    live = _live_placement_groups()
    with pytest.raises(WorkerError) as caught:
        WorkerGroup(Probe, Placement(world_size=1), kwargs={"fail": "no checkpoint at /x"})
    assert str(caught.value) == (
        f"trainer rank 0 on node {cluster} failed in Probe.__init__: "
        "ValueError: no checkpoint at /x"
    )
    assert _live_placement_groups() == live


def test_a_worker_class_ray_cannot_import_says_how_to_ship_it(cluster: str, tmp_path: Path) -> None:
    (tmp_path / "unshipped_worker.py").write_text("class Unshipped:\n    pass\n")
    spec = importlib.util.spec_from_file_location(
        "unshipped_worker", tmp_path / "unshipped_worker.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["unshipped_worker"] = module
    try:
        with pytest.raises(WorkerError) as caught:
            WorkerGroup(module.Unshipped, Placement(world_size=1))
    finally:
        del sys.modules["unshipped_worker"]
    assert str(caught.value) == (
        f"trainer rank 0 on node {cluster} failed in Unshipped.__init__: "
        "RaySystemError: System error: No module named 'unshipped_worker'; "
        "Ray's workers cannot import the worker class: install its package on every node, "
        "or call ray.cloudpickle.register_pickle_by_value(its module) before starting the group"
    )


def test_shutdown_is_idempotent_and_keeps_a_ray_it_did_not_start(cluster: str) -> None:
    group = WorkerGroup(Probe, Placement(world_size=1))
    pid = group.ranks_info()[0]["pid"]
    group.shutdown()
    group.shutdown()
    assert _wait_gone([pid]) == []
    assert ray.is_initialized()
    with pytest.raises(
        WorkerGroupClosedError, match=r"^the worker group is closed \(it was shut down\); "
    ):
        group.call("env")


def test_a_placement_the_cluster_cannot_host_times_out_clearly(cluster: str) -> None:
    live = _live_placement_groups()
    with pytest.raises(PlacementError) as caught:
        WorkerGroup(Probe, Placement(world_size=1, cpus_per_rank=64, ready_timeout_s=0.5))
    assert str(caught.value).startswith(
        "Ray did not grant 1 x {'CPU': 64} within 0.5 s; the cluster has {'CPU': 4.0, "
    )
    assert _live_placement_groups() == live


def test_gpu_placement_must_fill_its_nodes() -> None:
    with pytest.raises(ValueError) as caught:
        Placement(world_size=3, nodes=1, gpus_per_node=2)
    assert isinstance(caught.value, ConfigError)
    assert str(caught.value).endswith(
        ": with GPUs, world_size must equal nodes * gpus_per_node (1 * 2 = 2); "
        "set world_size=2 or change nodes / gpus_per_node"
    )
    assert Placement(world_size=16, nodes=2, gpus_per_node=8, address="auto").bundle() == {
        "CPU": 1,
        "GPU": 1,
    }


def test_several_nodes_need_a_cluster_address() -> None:
    with pytest.raises(
        ConfigError, match="a local Ray cluster has one node; set address to a cluster with 2$"
    ):
        Placement(world_size=2, nodes=2)


def test_env_may_not_override_what_the_group_sets() -> None:
    with pytest.raises(
        ConfigError,
        match=(
            "^env may not set CUDA_VISIBLE_DEVICES, RANK: the worker group sets them for each rank$"
        ),
    ):
        WorkerGroup(
            Probe,
            Placement(world_size=1),
            env={"RANK": "3", "CUDA_VISIBLE_DEVICES": "0", "OK": "1"},
        )


def test_local_rank_counts_ranks_on_the_same_node() -> None:
    assert rank_env(["a", "a", "b"], {"X": "1"}) == [
        {"X": "1", "RANK": "0", "WORLD_SIZE": "3", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"},
        {"X": "1", "RANK": "1", "WORLD_SIZE": "3", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"},
        {"X": "1", "RANK": "2", "WORLD_SIZE": "3", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"},
    ]


def test_missing_ray_asks_for_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(
        MissingDependencyError,
        match=r"^ray is not installed; run `pip install 'envhub\[megatron\]'`$",
    ):
        WorkerGroup(Probe, Placement(world_size=1))


def test_the_module_imports_without_ray() -> None:
    probe = "import sys, envhub.trainer.cluster.placement; print('ray' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60
    )
    assert (result.returncode, result.stdout) == (0, "False\n"), result.stderr
