"""The trainer ranks send: a backend whose weights live in other processes (the Megatron ranks)
moves them to vLLM from there.

Every rank holds a :class:`RankTransfer` over the same :class:`~.plan.TransferPlan`; on each
sync every rank iterates its weights (a collective: the ranks gather each tensor from its
shards), and rank 0 sends: it calls every engine over HTTP (:class:`~.routes.VLLMRoutes`) from
an event loop of its own, with the NCCL rendezvous on its own node. The driver only tells the
ranks to sync (:class:`RankSender`), unless rank 0 cannot reach the engines
(:func:`relay_reason`): then the driver relays the weights and sends them itself (:mod:`.driver`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from envhub.errors import ConfigError
from envhub.trainer.weight_sync import transfers
from envhub.trainer.weight_sync.clients import FanoutClient, LoopThread
from envhub.trainer.weight_sync.plan import SenderSide, SentWeights, TransferPlan
from envhub.trainer.weight_sync.routes import VLLMRoutes

if TYPE_CHECKING:  # vLLM loads only in the ranks, when they connect
    from vllm.distributed.weight_transfer.base import TrainerWeightTransferEngine

    from envhub.trainer.weight_sync.trainer_side import Weights

CONNECT, SEND, CLOSE = "connect_weight_transfer", "send_weights", "close_weight_transfer"
"""The rank worker's methods that :class:`RankSender` calls (each delegates to its
:class:`RankTransfer`)."""

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


class RemoteEngines:
    """Rank 0's client of every engine: HTTP routes on an event loop of its own."""

    def __init__(self, plan: TransferPlan) -> None:
        if not plan.urls:
            raise ConfigError(
                "a weight sender outside the driver reaches vLLM over HTTP; this engine has no URL"
            )
        self._thread = LoopThread()
        self._routes = [VLLMRoutes(url, plan.timeout_s) for url in plan.urls]
        self.client = FanoutClient(self._thread.loop, self._routes, transfers.get(plan.transfer))

    def close(self) -> None:
        """Close the HTTP clients and stop the loop."""
        for routes in self._routes:
            self._thread.run(routes.aclose())
        self._thread.close()


class _NotTheSender:
    """The client of a trainer rank other than 0: vLLM's trainer engines never call it there."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise RuntimeError(f"only trainer rank 0 talks to vLLM (called {name})")


def _no_engines() -> list[int]:
    """A rank other than 0 sees no engines."""
    return []


class RankTransfer:
    """One trainer rank's side of a transfer (every rank holds one; rank 0 sends).

    Build it with :meth:`connect`.
    """

    def __init__(
        self, transfer: TrainerWeightTransferEngine, engines: RemoteEngines | None
    ) -> None:
        self.transfer = transfer
        self._engines = engines

    @classmethod
    def connect(
        cls, plan: TransferPlan, weights: Weights, *, rank: int, address: str
    ) -> RankTransfer:
        """Join ``plan``: rank 0 connects to the engines, with the NCCL rendezvous at
        ``address`` (its node); the other ranks only iterate ``weights`` with it. Every rank
        calls this; it blocks until the engines have joined."""
        from envhub.trainer.weight_sync.trainer_side import (
            BackendWeightSource,
            start_trainer_engine,
            torch_dtype,
        )

        engines = RemoteEngines(plan) if rank == 0 else None
        client: Any = engines.client if engines is not None else _NotTheSender()
        sizes = engines.client.world_sizes if engines is not None else _no_engines
        side = SenderSide(
            rank=rank, bucket_bytes=plan.bucket_bytes, address=address, engine_world_sizes=sizes
        )
        transfer = transfers.get(plan.transfer)
        source = BackendWeightSource(weights, dtype=torch_dtype(plan.dtype))
        try:
            return cls(
                start_trainer_engine(transfer.trainer_init_info(side), client, source), engines
            )
        except BaseException:
            if engines is not None:
                engines.close()
            raise

    def send(self) -> SentWeights | None:
        """One sync (every rank takes part): rank 0's buckets and bytes, else None."""
        self.transfer.send_weights()
        return SentWeights.of(self.transfer) if self._engines is not None else None

    def close(self) -> None:
        """Leave the transfer (its shared file, communicator and HTTP clients)."""
        self.transfer.shutdown()
        if self._engines is not None:
            self._engines.close()
            self._engines = None


class RankGroup(Protocol):
    """The ranks as the driver reaches them (``cluster.WorkerGroup``)."""

    @property
    def closed(self) -> bool:
        """Whether the group is gone."""
        ...

    def call(self, method: str, /, *args: Any) -> list[Any]:
        """``method(*args)`` on every rank; the results in rank order."""
        ...


class RankSender:
    """A :class:`~.plan.WeightSender` whose syncs the ranks run (rank 0 sends, all gather)."""

    def __init__(self, group: RankGroup, description: str) -> None:
        self.group = group
        self.description = description

    @classmethod
    def connect(cls, group: RankGroup, plan: TransferPlan, description: str) -> RankSender:
        """Tell every rank to join ``plan`` (blocks until the engines have joined)."""
        group.call(CONNECT, plan)
        return cls(group, description)

    def send(self) -> SentWeights:
        """One sync, run by the ranks."""
        return SentWeights(*self.group.call(SEND)[0])

    def close(self) -> None:
        """The ranks leave the transfer (nothing to do once the group is gone)."""
        if not self.group.closed:
            self.group.call(CLOSE)


def relay_reason(plan: TransferPlan, rank0_node: str, driver_node: str) -> str | None:
    """Why rank 0 cannot send ``plan`` itself (``None`` when it can).

    An engine in the driver's process has no URL; a server on the driver's loopback is out of
    reach from another node; and a transfer whose engines run on the driver's host (the shared
    file of ``envhub_shm``) needs its sender there.
    """
    if not plan.urls:
        return "the engine runs inside the driver's process"
    if rank0_node == driver_node:
        return None
    if any(urlsplit(url).hostname in _LOOPBACK for url in plan.urls):
        return (
            "the vLLM server listens on the driver's loopback address "
            f"and rank 0 is on node {rank0_node}"
        )
    if transfers.get(plan.transfer).engines_on_driver_host:
        return (
            f"{plan.transfer} shares memory on the engines' node ({driver_node}) "
            f"and rank 0 is on node {rank0_node}"
        )
    return None
