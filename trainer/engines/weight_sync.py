"""Trainer-side weight sync into vLLM, through vLLM's own weight-transfer mechanism.

The trainer's weights are offered to vLLM as a ``WeightSource`` (HF checkpoint names, one tensor
at a time, from :meth:`TrainBackend.weights`); a ``TrainerWeightTransferEngine`` of the chosen
backend drives ``start_weight_update`` / ``update_weights`` (per bucket) / ``finish_weight_update``
through a control-plane client (HTTP to a server, or the in-process ``AsyncLLM``).

Backends: ``envhub_shm`` (shared memory, any CPU or GPU host, see ``shm_transfer``), and vLLM's
``nccl`` (GPUs, also across nodes) and ``ipc`` (CUDA IPC, colocated on one GPU).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    ParamMeta,
    TrainerWeightTransferEngine,
    WeightSource,
)
from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

from envhub.errors import ConfigError
from envhub.trainer.engines import shm_transfer


class BackendWeightSource(WeightSource):
    """A ``WeightSource`` over a train backend's :meth:`weights` (a fresh pass per sync),
    floating-point tensors cast to the engine's ``dtype`` (bf16 engines get half the bytes) and
    moved to ``device`` (NCCL sends from the GPU; the Megatron driver receives its buckets on
    the CPU)."""

    def __init__(
        self, weights: Callable[[], Iterator[tuple[str, torch.Tensor]]], dtype: torch.dtype | None = None, device: str | None = None
    ) -> None:
        self._weights = weights
        self._dtype = dtype
        self._device = device
        self._metadata: list[ParamMeta] | None = None

    def metadata(self) -> list[ParamMeta]:
        if self._metadata is None:  # names and shapes never change during a run
            self._metadata = [ParamMeta(name, self._wire_dtype(t), tuple(t.shape)) for name, t in self._weights()]
        return self._metadata

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self._weights():
            yield name, tensor.to(device=self._device, dtype=self._wire_dtype(tensor))

    def _wire_dtype(self, tensor: torch.Tensor) -> torch.dtype:
        return self._dtype if self._dtype is not None and tensor.is_floating_point() else tensor.dtype


class ThreadSafeClient:
    """A ``VLLMWeightSyncClient`` (blocking calls, as vLLM's trainer engines make them) over
    async control-plane calls that run on the event loop ``loop``.

    The trainer engine runs in a worker thread (NCCL must send while the engine receives, and
    blocking the loop would stall the in-process engine), and each call is handed back to the
    loop that owns the engine.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, calls: dict[str, Callable[..., Awaitable[Any]]]) -> None:
        self._loop = loop
        self._calls = calls

    def _run(self, name: str, *args: Any) -> None:
        asyncio.run_coroutine_threadsafe(self._calls[name](*args), self._loop).result()

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._run("init_weight_transfer_engine", init_info)

    def start_weight_update(self) -> None:
        self._run("start_weight_update")

    def update_weights(self, update_info: Any) -> None:
        self._run("update_weights", update_info)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._run("finish_weight_update", weight_version)


def trainer_init_info(backend: str, *, bucket_bytes: int, nccl: dict[str, Any] | None = None) -> Any:
    """The trainer-side init info of ``backend``."""
    if backend == shm_transfer.BACKEND:
        return shm_transfer.ShmTrainerInitInfo(rank=0, bucket_bytes=bucket_bytes)
    if backend == "ipc":
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

        return IPCTrainerInitInfo(rank=0, packed=True, packed_buffer_size_bytes=bucket_bytes)
    if backend == "nccl":
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        if nccl is None:
            raise ConfigError("the nccl weight transfer needs a rendezvous (master address, port, world size)")
        return NCCLTrainerInitInfo(rank=0, packed=True, packed_buffer_size_bytes=bucket_bytes, **nccl)
    raise ConfigError(f"unknown weight transfer backend {backend!r}")


def connect(init_info: Any, client: Any, source: WeightSource) -> TrainerWeightTransferEngine:
    """Rendezvous with the engine (blocking: call it from a worker thread)."""
    shm_transfer.register()
    return WeightTransferTrainerFactory.trainer_init(init_info, client=client, source=source)
