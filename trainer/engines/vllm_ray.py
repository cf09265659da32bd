"""A vLLM server placed on the Ray cluster (``rollout.vllm.mode: ray``).

The server is a ``vllm serve`` process started by a Ray actor (:class:`EngineHost`) in a
placement-group bundle, so Ray decides where the engine runs, next to or apart from the trainer:

- **split** (default): a bundle of its own, ``{"CPU": 1, "GPU": tensor_parallel}`` on GPUs;
- **colocated** (``rollout.vllm.colocate``): the bundle of the first trainer rank, sharing its
  node and GPU (the rank takes half of the bundle's GPU, the engine the other half; vLLM sleeps
  while the trainer updates).

The trainer's driver then talks to it over HTTP exactly as to a server it started itself
(:class:`~envhub.trainer.engines.vllm_transport.ServerTransport`). The server listens on its
node's address so that a driver on another node reaches it; it runs in vLLM's dev mode, so the
cluster's network must be trusted, as for Ray itself. Weights travel through vLLM's weight
transfer: ``envhub_shm`` needs the engine on the driver's node (it is placed there, and checked),
NCCL connects to the driver's node address.

:class:`PlacedServer` is the placed server alone, with a local server's blocking surface
(start, stop, its process, its log): the transport here wraps it, and the training service's
vLLM sampler runs its engines in it beside Megatron ranks (``trainer/service/vllm_engine.py``).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from envhub.errors import EngineError, EngineUnavailableError
from envhub.inference.vllm_server import VLLMServer
from envhub.trainer.cluster.ray_runtime import death_cause, import_ray, init_ray
from envhub.trainer.engines.vllm_transport import (
    EngineSettings,
    ServerTransport,
    serve_args,
    server_env,
)
from envhub.trainer.weight_sync import transfers

if TYPE_CHECKING:
    from envhub.trainer.backends.base import TrainBackend
    from envhub.trainer.config import TrainConfig


@dataclass(frozen=True)
class EngineSlot:
    """Where the engine's actor goes: a bundle of an existing placement group (colocated), or
    a placement group of its own with one bundle of ``num_cpus`` and ``num_gpus``."""

    num_cpus: float = 1
    num_gpus: float = 0
    placement_group: Any = None
    bundle_index: int = 0
    ready_timeout_s: float = 120.0


class EngineHost:
    """Runs in a Ray actor: owns one vLLM server process on the actor's node. The server ends
    with the actor, and with the run's driver (``driver``: its node id and pid) when it shares
    the driver's node, whichever dies first, however it dies."""

    def __init__(
        self, server_kwargs: dict[str, Any], driver: tuple[str, int] | None = None
    ) -> None:
        import ray

        self.node_ip = ray.util.get_node_ip_address()
        self.node_id = ray.get_runtime_context().get_node_id()
        watch = [driver[1]] if driver is not None and driver[0] == self.node_id else []
        self.server = VLLMServer(host=self.node_ip, watch=watch, **server_kwargs)

    def start(self) -> str:
        """Launch the vLLM server and wait until it is healthy; return its base URL."""
        return self.server.start()

    def where(self) -> dict[str, Any]:
        """The node (id, address) and the server's process id."""
        process = self.server.process
        return {
            "node_id": self.node_id,
            "node_ip": self.node_ip,
            "pid": process.pid if process else None,
            "log": str(self.server.log_path),
        }

    def exit_code(self, wait: float = 0.0) -> int | None:
        """The server's exit code, or None while it runs (waiting up to ``wait`` s)."""
        process = self.server.process
        if process is None:
            return None
        try:
            return process.wait(wait) if wait else process.poll()
        except subprocess.TimeoutExpired:
            return None

    def log_tail(self) -> str:
        """The last lines of the server's log (for the error when it dies)."""
        return self.server.log_tail()

    def stop(self) -> None:
        """Terminate the server's process group (SIGTERM, then SIGKILL); a no-op once exited."""
        self.server.stop()


class HostedProcess:
    """The server process an :class:`EngineHost` runs, seen from the driver: ``pid`` and
    ``poll()`` as :class:`subprocess.Popen`'s, so code written for a local server's process
    checks a placed one alike (an actor that died counts as its server's death)."""

    def __init__(self, actor: Any, pid: int) -> None:
        self.actor = actor
        self.pid = pid

    def poll(self) -> int | None:
        """The server's exit code, or None while it runs; -9 when its actor is gone."""
        ray = import_ray()
        try:
            return ray.get(self.actor.exit_code.remote(), timeout=10.0)
        except ray.exceptions.RayError:
            return -9


class PlacedServer:
    """A vLLM server that an :class:`EngineHost` actor runs in ``slot``: the blocking
    ``start`` / ``stop`` / ``process`` / ``log_path`` of a local
    :class:`~envhub.inference.vllm_server.VLLMServer`, placed by Ray (already initialised).

    Args:
        server: :class:`VLLMServer`'s keyword arguments (the host is the actor's node's).
        slot: Where the actor goes.
        same_node: Why the engine must run on this process's node (it is asked for there,
            and checked); None: anywhere.
    """

    def __init__(self, server: dict[str, Any], slot: EngineSlot, same_node: str | None) -> None:
        self.server = server
        self.slot = slot
        self.same_node = same_node
        self.actor: Any = None
        self.host: dict[str, Any] = {}
        """The actor's node (``node_id``, ``node_ip``), its server's ``pid`` and ``log``."""
        self.own_group: Any = None

    @property
    def process(self) -> HostedProcess | None:
        """The server's process, once started."""
        pid = self.host.get("pid")
        return None if pid is None else HostedProcess(self.actor, pid)

    @property
    def log_path(self) -> str:
        """The server's log file, on the actor's node."""
        return str(self.host.get("log", "?"))

    def start(self) -> str:
        """Place the actor, start its server and wait until it is healthy; its base URL.

        Raises:
            EngineUnavailableError: No room for it, or its actor or server failed to start.
            EngineError: It landed on another node than ``same_node`` needs.
        """
        ray = import_ray()
        self.place()
        try:
            url = ray.get(self.actor.start.remote())
            self.host = ray.get(self.actor.where.remote())  # now with the server's pid
        except ray.exceptions.RayError as err:
            raise self.failure("start", err) from err
        if self.same_node and self.host["node_id"] != ray.get_runtime_context().get_node_id():
            raise EngineError(
                f"the vLLM engine landed on node {self.host['node_ip']}, not this process's: "
                f"{self.same_node}"
            )
        return url

    def place(self) -> None:
        """Reserve the slot and start the actor there (not yet its server)."""
        ray = import_ray()
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        group = self.slot.placement_group
        if group is None:
            group = self.own_group = self._reserve()
        strategy = PlacementGroupSchedulingStrategy(
            group, placement_group_bundle_index=self.slot.bundle_index
        )
        remote = ray.remote(EngineHost).options(
            num_cpus=self.slot.num_cpus, num_gpus=self.slot.num_gpus, scheduling_strategy=strategy
        )
        driver = (ray.get_runtime_context().get_node_id(), os.getpid())
        self.actor = remote.remote(self.server, driver)
        try:
            self.host = ray.get(self.actor.where.remote(), timeout=self.slot.ready_timeout_s)
        except ray.exceptions.RayError as err:
            raise self.failure("start", err) from err

    def _reserve(self) -> Any:
        """A ready placement group of the slot's one bundle (on this node if it must be)."""
        ray = import_ray()
        from ray.util.placement_group import placement_group, remove_placement_group

        bundle = {"CPU": self.slot.num_cpus} | (
            {"GPU": self.slot.num_gpus} if self.slot.num_gpus else {}
        )
        here = ray.get_runtime_context().get_node_id() if self.same_node else None
        group = placement_group(
            [bundle], strategy="STRICT_PACK", name=f"envhub-vllm-{uuid.uuid4().hex[:8]}",
            _soft_target_node_id=here,
        )  # fmt: skip
        try:
            ray.get(group.ready(), timeout=self.slot.ready_timeout_s)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(group)
            raise EngineUnavailableError(
                f"Ray did not grant the vLLM engine {bundle} within "
                f"{self.slot.ready_timeout_s:g} s; free resources: {ray.available_resources()}"
            ) from None
        return group

    def failure(self, what: str, err: Exception) -> EngineUnavailableError:
        """The error to raise for Ray's ``err`` met while the engine was to ``what``."""
        ray = import_ray()
        node = self.host.get("node_ip", "?")
        if isinstance(err, ray.exceptions.RayActorError):
            return EngineUnavailableError(
                f"the vLLM engine's Ray actor (node {node}) died: {death_cause(err)}"
            )
        cause = getattr(err, "cause", None) or err
        return EngineUnavailableError(f"the vLLM engine on node {node} failed to {what}: {cause}")

    def raise_if_exited(self, wait: float = 0.0) -> None:
        """Raise :class:`EngineUnavailableError` with the exit code and the log's tail if the
        server exited (waiting up to ``wait`` s), or with the cause if its actor died."""
        if self.actor is None:
            return
        ray = import_ray()
        try:
            code = ray.get(self.actor.exit_code.remote(wait), timeout=wait + 30.0)
        except ray.exceptions.RayError as err:
            raise self.failure("answer", err) from err
        if code is not None:
            tail = ray.get(self.actor.log_tail.remote(), timeout=30.0)
            raise EngineUnavailableError(
                f"the vLLM server on node {self.host.get('node_ip')} exited with code {code}. "
                f"Last log lines ({self.log_path}):\n{tail}"
            )

    def stop(self) -> None:
        """Stop the server, kill the actor and free the slot it reserved; idempotent. Ray
        itself stays up: whoever initialised it shuts it down."""
        ray = import_ray()
        if self.actor is not None and ray.is_initialized():
            try:
                ray.get(self.actor.stop.remote(), timeout=60.0)
            except ray.exceptions.RayError:
                pass  # already dead: its server's guard ended the server with it
            ray.kill(self.actor, no_restart=True)
        self.actor = None
        if self.own_group is not None and ray.is_initialized():
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.own_group)
        self.own_group = None


class RayServerTransport(ServerTransport):
    """A :class:`ServerTransport` whose server an :class:`EngineHost` actor starts in ``slot``
    (a :class:`PlacedServer`)."""

    def __init__(
        self, settings: EngineSettings, slot: EngineSlot, *, address: str | None = None
    ) -> None:
        super().__init__(settings, url="ray")  # the URL is known once the actor has started it
        self.slot = slot
        self.address = address
        self.placed = PlacedServer(self._server_kwargs(), slot, self._same_node())
        self._started_ray = False

    @property
    def where(self) -> str:  # type: ignore[override]
        """The node the engine's actor runs on and which bundle it took, for the run's header."""
        bundle = (
            "in trainer rank 0's bundle"
            if self.slot.placement_group is not None
            else "in its own bundle"
        )
        return f"Ray actor on node {self.placed.host.get('node_ip', '?')} {bundle}"

    def _server_kwargs(self) -> dict[str, Any]:
        return {
            "model": self.settings.model,
            "served_model_name": "policy",
            "max_model_len": self.settings.max_model_len,
            "seed": self.settings.seed,
            "extra_args": serve_args(self.settings),
            "env": server_env(self.settings),
            "startup_timeout": self.settings.startup_timeout,
        }

    def _same_node(self) -> str | None:
        """Why the weight transfer needs the engine on the driver's node (shared memory)."""
        if not transfers.get(self.settings.weight_transfer).engines_on_driver_host:
            return None
        return (
            f"weight_transfer={self.settings.weight_transfer} shares memory within one node; "
            "on several nodes use GPUs (nccl)"
        )

    async def _launch(self) -> str:
        self._started_ray = init_ray(self.address, num_cpus=int(self.slot.num_cpus) + 1)
        self.trainer_address = import_ray().util.get_node_ip_address()
        return await asyncio.to_thread(self.placed.start)

    def _raise_if_exited(self, wait: float = 0.0) -> None:
        self.placed.raise_if_exited(wait)

    async def _shutdown(self) -> None:
        await asyncio.to_thread(self.placed.stop)
        if self._started_ray:
            self._started_ray = False
            import_ray().shutdown()


def engine_slot(config: TrainConfig, backend: TrainBackend) -> EngineSlot:
    """The engine's slot for ``rollout.vllm`` (colocated: the first bundle of the trainer's
    worker group, the Megatron backend's ``group``; a backend in this process has none)."""
    v = config.rollout.vllm
    on_gpu = getattr(backend.device, "type", "cpu") == "cuda"
    if not v.colocate:
        return EngineSlot(num_cpus=1, num_gpus=v.tensor_parallel if on_gpu else 0)
    group = getattr(backend, "group", None)
    if group is None:
        raise EngineError(
            "rollout.vllm.colocate needs trainer ranks on Ray (backend.kind=megatron)"
        )
    # The rank in bundle 0 took 1 - COLOCATED_GPU_SHARE of its GPU and all of its CPUs.
    return EngineSlot(
        num_cpus=0,
        num_gpus=COLOCATED_GPU_SHARE if on_gpu else 0,
        placement_group=group.placement_group,
        bundle_index=0,
    )


COLOCATED_GPU_SHARE = 0.5
"""The share of a colocated bundle's GPU that Ray hands the engine (Ray's GPU shares only
decide placement and visibility; memory is split by ``gpu_memory_utilization`` and sleep)."""
