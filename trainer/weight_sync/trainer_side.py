"""vLLM's trainer-side transfer engine over a backend's weights.

The trainer's weights are offered to vLLM as a ``WeightSource`` (HF checkpoint names, one tensor
at a time, a fresh pass per sync); a ``TrainerWeightTransferEngine`` of the chosen transfer
drives ``start_weight_update`` / ``update_weights`` (per bucket) / ``finish_weight_update``
through a client of the engines (:mod:`.clients`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    ParamMeta,
    TrainerWeightTransferEngine,
    WeightSource,
)
from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

from envhub.trainer.weight_sync import shm_backend

Weights = Callable[[], Iterator[tuple[str, torch.Tensor]]]
"""A fresh pass over the policy's weights in HF checkpoint format (``TrainBackend.weights``)."""


class BackendWeightSource(WeightSource):
    """A ``WeightSource`` over a train backend's weights.

    Floating-point tensors are cast to the engine's ``dtype`` (bf16 engines get half the bytes)
    and moved to ``device`` (NCCL and CUDA IPC send from the GPU; the Megatron driver receives
    its relayed buckets on the CPU).
    """

    def __init__(
        self, weights: Weights, dtype: torch.dtype | None = None, device: str | None = None
    ) -> None:
        self._weights = weights
        self._dtype = dtype
        self._device = device
        self._metadata: list[ParamMeta] | None = None

    def metadata(self) -> list[ParamMeta]:
        """Every tensor's name, wire dtype and shape (asked once: they never change in a run)."""
        if self._metadata is None:
            self._metadata = [
                ParamMeta(name, self._wire_dtype(t), tuple(t.shape)) for name, t in self._weights()
            ]
        return self._metadata

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self._weights():
            yield name, tensor.to(device=self._device, dtype=self._wire_dtype(tensor))

    def _wire_dtype(self, tensor: torch.Tensor) -> torch.dtype:
        return (
            self._dtype if self._dtype is not None and tensor.is_floating_point() else tensor.dtype
        )


def start_trainer_engine(
    init_info: Any, client: Any, source: WeightSource
) -> TrainerWeightTransferEngine:
    """Rendezvous with the engines through ``client`` (blocking: call it off the event loop)."""
    shm_backend.register()
    return WeightTransferTrainerFactory.trainer_init(init_info, client=client, source=source)


def torch_dtype(name: str | None) -> torch.dtype | None:
    """``torch.float32`` for ``"float32"``; None for None."""
    return getattr(torch, name) if name else None
