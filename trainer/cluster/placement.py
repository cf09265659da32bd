"""Places the ranks of a ``torch.distributed`` (Megatron) job on Ray and talks to them.

A :class:`WorkerGroup` reserves one placement-group bundle per rank, starts one Ray actor per
rank that hosts an instance of the caller's worker class, and gives every rank the environment
``init_process_group(init_method="env://")`` reads. Calls go to every rank at once; the first
failing rank ends the group (the others may be stuck in a collective with it), so the trainer
stops and resumes from its last checkpoint instead of hanging.

How the environment reaches a rank:

- ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` and the caller's ``env`` go in
  the actor's ``runtime_env``, so they are set before its process imports anything;
- ``MASTER_ADDR`` and ``MASTER_PORT`` (rank 0's node and a port free there) are only known once
  rank 0's process runs, so each rank sets them in ``os.environ`` before it builds the worker;
- ``CUDA_VISIBLE_DEVICES`` is Ray's: each GPU rank sees its one GPU as ``cuda:0``.

Errors (in ``envhub.errors``): :class:`~envhub.errors.WorkerError` when a rank's method
raises (naming the rank, its node and the exception), :class:`~envhub.errors.WorkerDiedError`
when a rank's process dies (crash, OOM kill, lost node),
:class:`~envhub.errors.WorkerGroupClosedError` once the group was shut down or failed,
:class:`~envhub.errors.PlacementError` when the cluster cannot host the job in time (naming what
was asked and what is there).

A call with a ``timeout`` that expires raises the built-in :class:`TimeoutError` and also ends
the group.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

from envhub.defaults import free_port
from envhub.errors import (
    ConfigError,
    PlacementError,
    WorkerDiedError,
    WorkerError,
    WorkerGroupClosedError,
)
from envhub.trainer.cluster.ray_runtime import death_cause, describe_failure, import_ray, init_ray

RESERVED_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES",
)
"""Variables the group sets itself; ``env`` may not override them."""

_GRACE_S = 2.0
"""After a rank raises, how long to look for a rank that died: a dead peer makes the others'
collectives raise too, and the death is the cause worth reporting."""


@dataclass(frozen=True)
class Placement:
    """Where and how many trainer ranks run."""

    world_size: int
    """Number of ranks (one Ray actor each)."""
    nodes: int = 1
    """Number of nodes; more than one needs ``address`` (a local cluster has one node)."""
    gpus_per_node: int = 0
    """GPUs per node, one per rank; 0 runs CPU ranks."""
    address: str | None = None
    """An existing Ray cluster (``"auto"``, ``"ray://host:10001"``, ``"host:6379"``); None
    starts a local one, or reuses Ray if this process already initialised it."""
    cpus_per_rank: int = 1
    """CPUs reserved for each rank."""
    gpu_share: float = 1.0
    """The share of its bundle's GPU each rank's actor takes (less than 1 leaves room for a
    colocated vLLM engine on the same GPU)."""
    ready_timeout_s: float = 120.0
    """Seconds to wait for the cluster to grant every rank's resources."""

    def __post_init__(self) -> None:
        if min(self.world_size, self.nodes, self.cpus_per_rank) < 1 or self.gpus_per_node < 0:
            raise ConfigError(
                f"{self}: world_size, nodes and cpus_per_rank must be >= 1, gpus_per_node >= 0"
            )
        if self.gpus_per_node and self.world_size != self.nodes * self.gpus_per_node:
            raise ConfigError(
                f"{self}: with GPUs, world_size must equal nodes * gpus_per_node "
                f"({self.nodes} * {self.gpus_per_node} = {self.nodes * self.gpus_per_node}); "
                f"set world_size={self.nodes * self.gpus_per_node} or change nodes / gpus_per_node"
            )
        if self.nodes > 1 and self.address is None:
            raise ConfigError(
                f"{self}: a local Ray cluster has one node; "
                f"set address to a cluster with {self.nodes}"
            )

    def bundle(self) -> dict[str, float]:
        """The resources one rank reserves."""
        return (
            {"CPU": self.cpus_per_rank, "GPU": 1}
            if self.gpus_per_node
            else {"CPU": self.cpus_per_rank}
        )


class _Rank:
    """Hosts one rank's worker inside a Ray actor."""

    def __init__(self) -> None:
        self._worker: Any = None

    def node_ip(self) -> str:
        import ray

        return ray.util.get_node_ip_address()

    def free_port(self) -> int:
        """A port free on this node, on every interface (the rendezvous of its ranks)."""
        return free_port("")

    def start(
        self, master_addr: str, master_port: int, worker_cls: type, args: tuple, kwargs: dict
    ) -> int:
        os.environ["MASTER_ADDR"] = master_addr
        os.environ["MASTER_PORT"] = str(master_port)
        self._worker = worker_cls(*args, **kwargs)
        return os.getpid()

    def run(self, method: str, args: tuple, kwargs: dict) -> Any:
        return getattr(self._worker, method)(*args, **kwargs)


def _init_ray(placement: Placement) -> bool:
    """Connects to or starts Ray; True when this call initialised it."""
    return init_ray(
        placement.address,
        num_cpus=placement.world_size * placement.cpus_per_rank,
        num_gpus=placement.gpus_per_node,
    )


def _plain_resources(resources: dict[str, float]) -> dict[str, float]:
    return {
        k: v
        for k, v in sorted(resources.items())
        if "_group_" not in k and not k.startswith("node:")
    }


def _reserve(placement: Placement, name: str) -> Any:
    """A ready placement group with one bundle per rank, or :class:`PlacementError`."""
    ray = import_ray()
    from ray.util.placement_group import placement_group, remove_placement_group

    bundles = [placement.bundle()] * placement.world_size
    pg = placement_group(bundles, strategy="PACK", name=f"{name}-{uuid.uuid4().hex[:8]}")
    try:
        ray.get(pg.ready(), timeout=placement.ready_timeout_s)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(pg)
        raise PlacementError(
            f"Ray did not grant {placement.world_size} x {placement.bundle()} within "
            f"{placement.ready_timeout_s:g} s; the cluster has "
            f"{_plain_resources(ray.cluster_resources())}, "
            f"of which {_plain_resources(ray.available_resources())} are free"
        ) from None
    return pg


def _bundle_nodes(pg: Any) -> tuple[list[str], list[str]]:
    """(node id, node IP) of each bundle, in bundle order."""
    ray = import_ray()
    from ray.util.placement_group import placement_group_table

    by_bundle = placement_group_table(pg)["bundles_to_node_id"]
    ips = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}
    ids = [by_bundle[i] for i in range(len(by_bundle))]
    return ids, [ips[node_id] for node_id in ids]


def rank_env(node_ids: list[str], env: dict[str, str]) -> list[dict[str, str]]:
    """Each rank's static environment: ``env`` plus its ``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK`` (its index among the ranks on its node) and ``LOCAL_WORLD_SIZE``."""
    out = []
    for rank, node in enumerate(node_ids):
        local = {
            "RANK": rank,
            "WORLD_SIZE": len(node_ids),
            "LOCAL_RANK": node_ids[:rank].count(node),
            "LOCAL_WORLD_SIZE": node_ids.count(node),
        }
        out.append({**env, **{k: str(v) for k, v in local.items()}})
    return out


class WorkerGroup:
    """`world_size` Ray actors of `worker_cls`, one per rank, in one placement group.

    Each rank builds ``worker_cls(*args, **kwargs)`` in its own process after its environment is
    set (see the module docstring), so the constructor may call
    ``torch.distributed.init_process_group(init_method="env://")``. ``worker_cls`` must be
    importable by Ray's workers or registered with ``ray.cloudpickle.register_pickle_by_value``.
    The constructors run without a time limit (loading a checkpoint can take long); a rank that
    raises or dies in its constructor fails ``WorkerGroup(...)`` the way it fails :meth:`call`.
    ``name`` prefixes the placement group's name (names are unique in a Ray namespace, so a
    random suffix lets several groups share one).

    Example::

        with WorkerGroup(MegatronWorker, Placement(world_size=8, gpus_per_node=8)) as group:
            losses = group.call("train_step", batch)
    """

    def __init__(
        self,
        worker_cls: type,
        placement: Placement,
        *,
        env: dict[str, str] | None = None,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
        name: str = "envhub-trainer",
    ) -> None:
        clash = sorted(set(env or {}) & set(RESERVED_ENV))
        if clash:
            raise ConfigError(
                f"env may not set {', '.join(clash)}: the worker group sets them for each rank"
            )
        self.worker_cls = worker_cls
        self.placement = placement
        self._actors: list[Any] = []
        self._pg: Any = None
        self._ips: list[str] = []
        self._pids: list[int] = []
        self._closed: str | None = None
        self._started_ray = _init_ray(placement)
        try:
            self._start(env or {}, args, kwargs or {}, name)
        except BaseException:
            self.shutdown()
            raise

    def _start(self, env: dict[str, str], args: tuple, kwargs: dict[str, Any], name: str) -> None:
        ray = import_ray()
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self._pg = _reserve(self.placement, name)
        node_ids, self._ips = _bundle_nodes(self._pg)
        remote = ray.remote(_Rank)
        for rank, rank_vars in enumerate(rank_env(node_ids, env)):
            self._actors.append(
                remote.options(
                    num_cpus=self.placement.cpus_per_rank,
                    num_gpus=self.placement.gpu_share if self.placement.gpus_per_node else 0,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        self._pg, placement_group_bundle_index=rank
                    ),
                    runtime_env={"env_vars": rank_vars},
                ).remote()
            )
        master = self._actors[0]
        addr, port = ray.get([master.node_ip.remote(), master.free_port.remote()])
        refs = [a.start.remote(addr, port, self.worker_cls, args, kwargs) for a in self._actors]
        self._pids = self._gather(refs, f"{self.worker_cls.__name__}.__init__", None)

    def call(
        self, method: str, /, *args: Any, timeout: float | None = None, **kwargs: Any
    ) -> list[Any]:
        """Calls ``method(*args, **kwargs)`` on every rank's worker at once.

        Args:
            method: The name of a method of ``worker_cls``.
            timeout: Seconds to wait for every rank; None waits as long as it takes.

        Returns:
            The ranks' results, in rank order.

        Raises:
            WorkerError: A rank raised (:class:`WorkerDiedError`: its process died); the group is
                closed and its actors killed.
            TimeoutError: ``timeout`` passed first; the group is closed.
        """
        return self.call_ranks(
            method, [args] * self.placement.world_size, timeout=timeout, **kwargs
        )

    def call_ranks(
        self,
        method: str,
        per_rank_args: list[tuple],
        /,
        *,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> list[Any]:
        """Like :meth:`call`, but rank ``i`` gets ``*per_rank_args[i]`` (and every rank
        ``**kwargs``)."""
        self._check_open()
        if not callable(getattr(self.worker_cls, method, None)):
            raise AttributeError(f"{self.worker_cls.__name__} has no method {method!r}")
        if len(per_rank_args) != len(self._actors):
            raise ValueError(
                f"per_rank_args has {len(per_rank_args)} entries for {len(self._actors)} ranks"
            )
        refs = [
            a.run.remote(method, tuple(a_args), kwargs)
            for a, a_args in zip(self._actors, per_rank_args, strict=True)
        ]
        return self._gather(refs, method, timeout)

    @property
    def placement_group(self) -> Any:
        """The ranks' Ray placement group (bundle ``i`` holds rank ``i``), for colocating other
        actors with them."""
        self._check_open()
        return self._pg

    @property
    def closed(self) -> bool:
        """Whether the group was shut down or lost a rank (its calls raise then)."""
        return self._closed is not None

    def ranks_info(self) -> list[dict[str, Any]]:
        """``{"rank", "node", "pid"}`` of every rank, for logs."""
        self._check_open()
        return [
            {"rank": r, "node": ip, "pid": pid}
            for r, (ip, pid) in enumerate(zip(self._ips, self._pids, strict=True))
        ]

    def shutdown(self) -> None:
        """Kills the actors and frees the placement group; stops Ray only if this group started
        it. Idempotent."""
        self._release("it was shut down")
        self._free_placement()
        if self._started_ray:
            self._started_ray = False
            import_ray().shutdown()

    def __enter__(self) -> WorkerGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _check_open(self) -> None:
        if self._closed is not None:
            raise WorkerGroupClosedError(
                f"the worker group is closed ({self._closed}); start a new WorkerGroup "
                "(and resume from the last checkpoint)"
            )

    def _release(self, reason: str) -> None:
        """Close the group and kill its ranks. Its placement group stays until :meth:`shutdown`:
        actors placed in its bundles by others (a colocated vLLM engine) must be stopped by
        their owners first, as removing the group kills them at once, and a vLLM server killed
        so leaves its engine process running."""
        ray = import_ray()
        if self._closed is None:
            self._closed = reason
        if not ray.is_initialized():
            self._actors, self._pg = [], None
            return
        for actor in self._actors:
            ray.kill(actor, no_restart=True)
        self._actors = []

    def _free_placement(self) -> None:
        if self._pg is not None and import_ray().is_initialized():
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._pg)
        self._pg = None

    def _gather(self, refs: list[Any], method: str, timeout: float | None) -> list[Any]:
        """Every ref's result in order; the first failure closes the group and raises at once."""
        ray = import_ray()
        rank_of = {ref: rank for rank, ref in enumerate(refs)}
        results: list[Any] = [None] * len(refs)
        pending = list(refs)
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, pending = ray.wait(pending, num_returns=1, timeout=left)
            if not ready:
                late = sorted(rank_of[ref] for ref in pending)
                self._release(f"ranks {late} did not finish {method} within {timeout:g} s")
                raise TimeoutError(
                    f"trainer ranks {late} did not finish {method} within {timeout:g} s; "
                    "the group is closed"
                )
            try:
                results[rank_of[ready[0]]] = ray.get(ready[0])
            except ray.exceptions.RayError as err:
                self._fail(method, rank_of, {rank_of[ready[0]]: err}, pending)
        return results

    def _fail(
        self, method: str, rank_of: dict[Any, int], failed: dict[int, Exception], pending: list[Any]
    ) -> None:
        """Closes the group and raises the error of the rank that caused the failure."""
        ray = import_ray()
        if pending and not any(
            isinstance(e, ray.exceptions.RayActorError) for e in failed.values()
        ):
            done, _ = ray.wait(pending, num_returns=len(pending), timeout=_GRACE_S)
            for ref in done:
                try:
                    ray.get(ref)
                except ray.exceptions.RayError as err:
                    failed[rank_of[ref]] = err
        deaths = [r for r, e in failed.items() if isinstance(e, ray.exceptions.RayActorError)]
        rank = deaths[0] if deaths else next(iter(failed))
        others = [f"rank {r}: {describe_failure(e)[:200]}" for r, e in failed.items() if r != rank]
        error = self._error(rank, method, failed[rank], others)
        self._release(str(error))
        raise error from failed[rank]

    def _error(self, rank: int, method: str, err: Exception, others: list[str]) -> WorkerError:
        ray = import_ray()
        node = self._ips[rank]
        also = f" (then also {'; '.join(others)})" if others else ""
        if isinstance(err, ray.exceptions.RayActorError):
            return WorkerDiedError(
                f"trainer rank {rank} on node {node} died: {death_cause(err)}{also}",
                worker=rank,
                node=node,
            )
        message = (
            f"trainer rank {rank} on node {node} failed in {method}: {describe_failure(err)}{also}"
        )
        return WorkerError(message, worker=rank, node=node)
