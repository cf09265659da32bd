"""Trainer-side weight sync into vLLM, through vLLM's own weight-transfer mechanism.

The trainer's weights are offered to vLLM as a ``WeightSource`` (HF checkpoint names, one tensor
at a time, from :meth:`TrainBackend.weights`); a ``TrainerWeightTransferEngine`` of the chosen
backend drives ``start_weight_update`` / ``update_weights`` (per bucket) / ``finish_weight_update``
through a control-plane client (HTTP to a server, or the in-process ``AsyncLLM``).

Two places send. The torch backend's weights live in the driver, so the driver sends
(:class:`EngineSender` over a :class:`ThreadSafeClient` of the engine's transport). A backend
whose weights live in other processes (the Megatron ranks) sends from there: every rank runs
:func:`connect_rank` with the same :class:`TransferPlan` (each iterates its weights, which is a
collective), and rank 0, the sender, drives every engine over HTTP (:class:`EngineControlClient`),
with the NCCL rendezvous on its own node.

Backends: ``envhub_shm`` (shared memory, any CPU or GPU host, see ``shm_transfer``), and vLLM's
``nccl`` (GPUs, also across nodes) and ``ipc`` (CUDA IPC, colocated on one GPU).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import torch
from vllm.distributed.weight_transfer.base import (
    ParamMeta,
    TrainerWeightTransferEngine,
    WeightSource,
)
from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

from envhub.errors import ConfigError, EngineError, EngineUnavailableError
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


def trainer_init_info(backend: str, *, bucket_bytes: int, nccl: dict[str, Any] | None = None, rank: int = 0) -> Any:
    """The trainer-side init info of ``backend`` for trainer ``rank`` (0 sends; the others
    only join the collectives that gather the weights)."""
    if backend == shm_transfer.BACKEND:
        return shm_transfer.ShmTrainerInitInfo(rank=rank, bucket_bytes=bucket_bytes)
    if backend == "ipc":
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

        return IPCTrainerInitInfo(rank=rank, packed=True, packed_buffer_size_bytes=bucket_bytes)
    if backend == "nccl":
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        if nccl is None:
            raise ConfigError("the nccl weight transfer needs a rendezvous (master address, port, world size)")
        return NCCLTrainerInitInfo(rank=rank, packed=True, packed_buffer_size_bytes=bucket_bytes, **nccl)
    raise ConfigError(f"unknown weight transfer backend {backend!r}")


def connect(init_info: Any, client: Any, source: WeightSource) -> TrainerWeightTransferEngine:
    """Rendezvous with the engine (blocking: call it from a worker thread)."""
    shm_transfer.register()
    return WeightTransferTrainerFactory.trainer_init(init_info, client=client, source=source)


class EngineSender:
    """A connected trainer engine of the driver: :meth:`send` runs one full sync."""

    def __init__(self, transfer: TrainerWeightTransferEngine, description: str = "sent by the trainer process") -> None:
        self.transfer = transfer
        self.description = description

    def send(self) -> tuple[int, int]:
        """One sync; the buckets and bytes it sent (0 where the backend does not count them)."""
        self.transfer.send_weights()
        return sent_counts(self.transfer)

    def close(self) -> None:
        self.transfer.shutdown()


def sent_counts(transfer: TrainerWeightTransferEngine) -> tuple[int, int]:
    """Buckets and bytes of ``transfer``'s last sync (``envhub_shm`` counts them; vLLM's do not)."""
    return int(getattr(transfer, "buckets_sent", 0)), int(getattr(transfer, "bytes_sent", 0))


# -- senders outside the driver ---------------------------------------------------------------


@dataclass(frozen=True)
class TransferPlan:
    """What a sender outside the driver needs (plain values: it travels to Ray actors)."""

    backend: str
    """``envhub_shm``, ``nccl`` or ``ipc``."""
    bucket_bytes: int
    dtype: str | None
    """The engines' dtype: floating-point weights travel in it (None: as they are)."""
    urls: tuple[str, ...]
    """Each engine's base URL (empty when the engine lives in the driver's process)."""
    timeout_s: float = 600.0


class EngineControlClient:
    """vLLM's ``VLLMWeightSyncClient`` over the HTTP routes of every engine at once: each call
    goes to all of them concurrently and returns when all have answered, so one sync reaches
    every engine. For NCCL each engine's workers get their own ranks in the one group, after
    the trainer's (``rank_offset``)."""

    def __init__(self, urls: tuple[str, ...] | list[str], timeout_s: float = 600.0) -> None:
        if not urls:
            raise ConfigError("a weight sender outside the driver reaches vLLM over HTTP; this engine has no URL")
        self.urls = [url.rstrip("/") for url in urls]
        self._clients = [httpx.Client(base_url=url, timeout=timeout_s) for url in self.urls]
        self._pool = ThreadPoolExecutor(max_workers=len(self.urls), thread_name_prefix="envhub-weight-sync")
        self._world_sizes: list[int] | None = None

    def world_sizes(self) -> list[int]:
        """Each engine's workers (tensor x pipeline x data parallel)."""
        if self._world_sizes is None:
            self._world_sizes = [int(body["world_size"]) for body in self._each("GET", "/get_world_size")]
        return self._world_sizes

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        if "rank_offset" not in init_info:
            self._each("POST", "/init_weight_transfer_engine", {"init_info": init_info})
            return
        from envhub.trainer.engines.vllm_replicas import nccl_rank_offsets

        offsets = nccl_rank_offsets(int(init_info["rank_offset"]), self.world_sizes())
        self._each("POST", "/init_weight_transfer_engine", bodies=[{"init_info": {**init_info, "rank_offset": o}} for o in offsets])

    def start_weight_update(self) -> None:
        self._each("POST", "/start_weight_update")

    def update_weights(self, update_info: Any) -> None:
        from vllm.distributed.weight_transfer.clients import _json_safe_update_payload

        # CUDA IPC handles are not JSON: pickled as vLLM's own HTTP client does.
        self._each("POST", "/update_weights", {"update_info": _json_safe_update_payload(update_info)})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._each("POST", "/finish_weight_update", {"weight_version": weight_version} if weight_version else None)

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        for client in self._clients:
            client.close()

    def _each(self, method: str, path: str, body: dict[str, Any] | None = None, *, bodies: list[Any] | None = None) -> list[dict[str, Any]]:
        bodies = bodies if bodies is not None else [body] * len(self.urls)
        calls = [self._pool.submit(self._call, k, method, path, b) for k, b in enumerate(bodies)]
        return [call.result() for call in calls]

    def _call(self, k: int, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        try:
            response = self._clients[k].request(method, path, json=body)
        except httpx.TransportError as e:
            raise EngineUnavailableError(f"vLLM at {self.urls[k]} did not answer {path}: {type(e).__name__}: {e}") from e
        if response.status_code != 200:
            raise EngineError(f"vLLM at {self.urls[k]}: {path} -> HTTP {response.status_code}: {response.text[:500]}")
        return response.json() if response.content else {}


class _NotTheSender:
    """The client of a trainer rank other than 0: vLLM's engines never call it there."""

    def close(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise RuntimeError(f"only trainer rank 0 talks to vLLM (called {name})")


def connect_rank(plan: TransferPlan, weights: Callable[[], Iterator[tuple[str, torch.Tensor]]], *, rank: int, address: str) -> TrainerWeightTransferEngine:
    """This trainer rank's side of ``plan`` (every rank calls it, then ``send_weights`` on each
    sync): rank 0 connects to the engines, with the NCCL rendezvous at ``address`` (its node),
    the other ranks only iterate ``weights`` with it. Blocks until the engines have joined."""
    client: Any = EngineControlClient(plan.urls, plan.timeout_s) if rank == 0 else _NotTheSender()
    nccl = None
    if plan.backend == "nccl":
        nccl = _rendezvous(client, address) if rank == 0 else {"master_address": "", "master_port": 0, "world_size": 0}
    info = trainer_init_info(plan.backend, bucket_bytes=plan.bucket_bytes, nccl=nccl, rank=rank)
    source = BackendWeightSource(weights, dtype=getattr(torch, plan.dtype) if plan.dtype else None)
    return connect(info, client, source)


def _rendezvous(client: EngineControlClient, address: str) -> dict[str, Any]:
    """The NCCL group of the sender (rank 0, listening at ``address``) and every engine's workers."""
    from envhub.inference.vllm_server import free_port

    return {"master_address": address, "master_port": free_port(address), "world_size": 1 + sum(client.world_sizes())}
