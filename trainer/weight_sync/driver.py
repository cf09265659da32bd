"""The driver sends: the torch backend's weights live in the driver's process, and a backend
whose ranks cannot reach the engines relays its weights through the driver.

The driver's engines are its transport's replicas, called on the driver's own event loop (an
in-process vLLM lives there); the sync itself runs in a worker thread (:mod:`.clients`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from vllm.distributed.weight_transfer.base import TrainerWeightTransferEngine

from envhub.trainer.weight_sync import transfers
from envhub.trainer.weight_sync.clients import FanoutClient
from envhub.trainer.weight_sync.plan import SenderSide, SentWeights, TransferPlan, WeightReceiver
from envhub.trainer.weight_sync.trainer_side import (
    BackendWeightSource,
    Weights,
    start_trainer_engine,
    torch_dtype,
)


class DriverSender:
    """A :class:`~.plan.WeightSender` in the driver's process."""

    description = "sent by the trainer process"

    def __init__(self, transfer: TrainerWeightTransferEngine) -> None:
        self.transfer = transfer
        """vLLM's trainer-side engine of the chosen transfer."""

    def send(self) -> SentWeights:
        """One full sync of what the backend's weights yield now."""
        self.transfer.send_weights()
        return SentWeights.of(self.transfer)

    def close(self) -> None:
        """Release the transfer (the shared file, the communicator)."""
        self.transfer.shutdown()


def connect_driver(
    plan: TransferPlan,
    weights: Weights,
    engines: Sequence[WeightReceiver],
    loop: asyncio.AbstractEventLoop,
    address: str,
) -> DriverSender:
    """Connect the driver to ``engines`` as ``plan`` says; blocks until they have joined, so call
    it from a worker thread (the engines' calls run on ``loop``).

    Args:
        plan: The transfer, bucket size and dtype.
        weights: The backend's weights (``TrainBackend.weights``).
        engines: Every engine of the policy (the transport's replicas).
        loop: The event loop the engines belong to.
        address: Where the engines reach this process (the NCCL rendezvous).
    """
    transfer = transfers.get(plan.transfer)
    client = FanoutClient(loop, engines, transfer)
    side = SenderSide(
        rank=0,
        bucket_bytes=plan.bucket_bytes,
        address=address,
        engine_world_sizes=client.world_sizes,
    )
    source = BackendWeightSource(
        weights, dtype=torch_dtype(plan.dtype), device=transfer.driver_device
    )
    return DriverSender(start_trainer_engine(transfer.trainer_init_info(side), client, source))
