"""The typed seam of a weight sync: what is sent where, who sends it, who receives it.

Nothing here imports torch or vLLM: the config, the backends and the engines name these types
without loading either.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol


@dataclass(frozen=True)
class TransferPlan:
    """What any sender needs to connect (plain values: it travels to Ray actors)."""

    transfer: str
    """The transfer's name (a module of ``weight_sync.transfers``): ``envhub_shm``, ``nccl``,
    ``ipc``."""
    bucket_bytes: int
    """Size of one bucket of weights (whole decoder layers; a bigger layer gets its own)."""
    dtype: str | None
    """The engines' dtype: floating-point weights travel in it (None: as they are)."""
    urls: tuple[str, ...]
    """Each engine's base URL (empty when an engine lives in the driver's process)."""
    timeout_s: float = 600.0
    """How long one control call to an engine may take."""


class SentWeights(NamedTuple):
    """What one sync moved (0 where the transfer does not count it: vLLM's own do not)."""

    buckets: int
    bytes: int

    @classmethod
    def of(cls, transfer: Any) -> SentWeights:
        """What vLLM's trainer-side engine ``transfer`` sent in its last sync."""
        return cls(
            int(getattr(transfer, "buckets_sent", 0)), int(getattr(transfer, "bytes_sent", 0))
        )


class WeightSender(Protocol):
    """Moves the trainer's current weights to every engine, once per :meth:`send`."""

    description: str
    """Who sends, for the run's header ("sent by the trainer process", "by trainer rank 0 ...")."""

    def send(self) -> SentWeights:
        """One full sync (blocking: the engine calls it from a worker thread)."""
        ...

    def close(self) -> None:
        """Release the transfer (shared file, communicator, clients); idempotent."""
        ...


class WeightReceiver(Protocol):
    """One vLLM engine's weight-update routes, as the driver's event loop calls them.

    vLLM's names: ``init_weight_transfer_engine`` once, then per sync ``start_weight_update``,
    ``update_weights`` per bucket and ``finish_weight_update``.
    """

    @property
    def url(self) -> str | None:
        """The engine's base URL, or None when it lives in this process."""
        ...

    async def world_size(self) -> int:
        """The engine's workers (tensor x pipeline x data parallel)."""
        ...

    async def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        """Join the trainer's transfer (the worker side of ``init_info``)."""
        ...

    async def start_weight_update(self) -> None:
        """Begin receiving one sync."""
        ...

    async def update_weights(self, update_info: Any) -> None:
        """Receive one bucket."""
        ...

    async def finish_weight_update(self, weight_version: str | None = None) -> None:
        """Finish the sync (vLLM finalises the layers it reloaded)."""
        ...


@dataclass(frozen=True)
class SenderSide:
    """Where a trainer process stands in a transfer."""

    rank: int
    """The trainer rank: 0 sends; the others only take part in gathering the weights."""
    bucket_bytes: int
    address: str
    """Where the engines reach the sender (the NCCL rendezvous listens there)."""
    engine_world_sizes: Callable[[], list[int]]
    """Each engine's workers; asked only by a transfer that needs them (NCCL)."""


def same_info_for_each(
    init_info: dict[str, Any], world_sizes: Callable[[], list[int]]
) -> list[dict[str, Any]] | None:
    """Every engine joins with the trainer's ``init_info`` unchanged (``None``: the same for
    all)."""
    return None


@dataclass(frozen=True)
class Transfer:
    """How envhub uses one of vLLM's weight-transfer backends (one module of ``transfers`` each)."""

    name: str
    """vLLM's name for the backend (``--weight-transfer-config '{"backend": NAME}'``)."""
    needs_gpu: bool
    """Moves CUDA tensors (refused on a CPU run)."""
    engines_on_driver_host: bool
    """The engines must run on the driver's host (shared memory): Ray places them there, and a
    trainer rank on another node hands its weights to the driver to send."""
    driver_device: str | None
    """Where the driver stages each tensor before sending (``cuda``: from the GPU)."""
    trainer_init_info: Callable[[SenderSide], Any]
    """vLLM's ``TrainerInitInfo`` for a trainer process (may rendezvous: call it off the loop)."""
    engine_init_infos: Callable[
        [dict[str, Any], Callable[[], list[int]]], list[dict[str, Any]] | None
    ] = same_info_for_each
    """The worker-side init info each engine gets from the trainer's, when they differ (NCCL
    ranks per engine); ``None``: every engine gets the same."""
    server_env: Mapping[str, str] = field(default_factory=dict)
    """Environment a ``vllm serve`` process needs for this backend."""
