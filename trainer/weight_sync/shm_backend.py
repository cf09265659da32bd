"""``envhub_shm`` as a vLLM weight-transfer backend: both sides, loaded by vLLM as a plugin.

vLLM's own backends move weights over NCCL (between GPUs and nodes) or CUDA IPC (colocated on a
GPU); neither runs on a CPU. This backend plugs into the same mechanism
(``vllm.distributed.weight_transfer``: ``init_weight_transfer_engine``, ``start_weight_update``,
``update_weights``, ``finish_weight_update``, driven over HTTP or in process) and moves the bytes
through one shared-memory file:

- the trainer writes a **bucket** of parameters (whole decoder layers, up to ``bucket_bytes``)
  into the file and sends only names, dtypes, shapes and offsets;
- each vLLM worker maps the file and loads the bucket with ``model.load_weights`` inside vLLM's
  layerwise reload (started in ``start_weight_update``, finalised in ``finish_weight_update``),
  which is what makes checkpoint-format weights work on the CPU, where vLLM repacks its linear
  layers into a kernel format (``load_weights`` alone fails there);
- buckets end on layer boundaries (vLLM's ``layerwise_groups``): a layer is processed as soon as
  all its weights have arrived, so the file can be overwritten by the next bucket.

vLLM loads this module in each of its processes through the ``vllm.general_plugins`` entry point
(``register``); select it with ``--weight-transfer-config '{"backend": "envhub_shm"}'``. How
envhub itself uses it (where the sender must run) is ``transfers/envhub_shm.py``.
"""

from __future__ import annotations

import mmap
import os
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from vllm.distributed.weight_transfer.base import (
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    VLLMWeightSyncClient,
    WeightSource,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from envhub.lifetime.procs import exists

BACKEND = "envhub_shm"
DEFAULT_BUCKET_BYTES = 256 << 20
_ALIGN = 64  # every tensor starts on a cache-line boundary


@dataclass
class ShmInitInfo(WeightTransferInitInfo):
    """Worker-side init info: the protocol version both sides speak."""

    protocol: int = 1


@dataclass
class ShmUpdateInfo(WeightTransferUpdateInfo):
    """One bucket: where each tensor lies in the shared file."""

    path: str
    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    offsets: list[int]

    def __post_init__(self) -> None:
        n = len(self.names)
        if not (len(self.dtype_names) == len(self.shapes) == len(self.offsets) == n):
            raise ValueError("names, dtype_names, shapes and offsets must have the same length")


@dataclass
class ShmTrainerInitInfo(TrainerInitInfo):
    """Trainer-side init info: the bucket size and where the shared file lives."""

    backend: ClassVar[str] = BACKEND
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    directory: str | None = None
    """Folder of the shared file (default: ``/dev/shm`` when it has room, else the temp dir)."""


class ShmWeightTransferEngine(WeightTransferEngine[ShmInitInfo, ShmUpdateInfo]):
    """The vLLM-worker side, vLLM's ``WeightTransferEngine`` for ``envhub_shm``: maps the
    trainer's file and loads each bucket."""

    init_info_cls = ShmInitInfo
    update_info_cls = ShmUpdateInfo
    supports_draft_weight_update = False

    def init_transfer_engine(self, init_info: ShmInitInfo) -> None:
        """vLLM's one-time set-up hook: check that the trainer speaks protocol 1. Nothing is
        opened yet; each update names the shared file it uses.

        Raises:
            ValueError: The trainer speaks another protocol version.
        """
        if init_info.protocol != 1:
            raise ValueError(
                f"envhub_shm protocol {init_info.protocol} is not supported (this worker speaks 1)"
            )

    def start_weight_update(self) -> None:
        """vLLM's hook before the first bucket: start the model's layerwise reload, so that
        checkpoint-format weights can be loaded into the processed layers."""
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def receive_weights(self, update_info: ShmUpdateInfo) -> None:
        """Map the shared file and load the bucket's tensors with ``model.load_weights``.

        The tensors are views of the mapping, not copies; the mapping is closed before returning
        because the trainer overwrites the file with the next bucket.

        Raises:
            ValueError: A tensor lies outside the file, or a layer got only part of its weights
                in this bucket (vLLM still holds views of the mapping).
        """
        with open(update_info.path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        buffer = torch.frombuffer(mapped, dtype=torch.uint8)
        weights = list(_views(buffer, update_info))
        self.model.load_weights(weights)
        del weights, buffer
        try:
            mapped.close()
        except BufferError:
            # vLLM still holds views: a layer whose weights are only partly in this bucket
            # waits for the rest, and the trainer is about to overwrite the file.
            raise ValueError(
                "envhub_shm: a vLLM layer received only part of its weights in one bucket; "
                "buckets must hold whole layers "
                f"(this one started with {update_info.names[0]!r})"
            ) from None

    def update_weights(self, update_info: dict[str, Any]) -> None:
        """vLLM's per-bucket entry point: parse ``update_info`` and :meth:`receive_weights`,
        then wait for the GPU only when there is one."""
        # The base class synchronises the accelerator, which a CPU-only build does not have.
        self.receive_weights(self.parse_update_info(update_info))
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def finish_weight_update(self) -> None:
        """vLLM's hook after the last bucket: finalise the layerwise reload (processing the
        layers that got nothing), then repack tied layers on the CPU (see
        :func:`_repack_tied_layers`)."""
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)
        _repack_tied_layers(self.model)

    def shutdown(self) -> None:
        """Nothing to release: each bucket's mapping is closed once it is loaded, and the file
        belongs to the trainer."""


def _repack_tied_layers(model: torch.nn.Module) -> None:
    """Re-run weight processing for layers that share a parameter (a tied ``lm_head``).

    On the CPU, vLLM prepacks each linear weight for its GEMM kernel when the layer is
    processed. A tied ``lm_head`` receives no checkpoint weight of its own, so layerwise reload
    leaves its prepacked copy stale: logits would come from the old embedding (measured:
    logprobs off by 0.7 after a sync that changed only the embedding). Repacking from the
    shared, now updated parameter fixes it. GPU kernels read the parameter itself.
    """
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    owners: dict[int, list[torch.nn.Module]] = {}
    for module in model.modules():
        for parameter in module.parameters(recurse=False):
            owners.setdefault(id(parameter), []).append(module)
    for modules in owners.values():
        if len(modules) < 2:
            continue
        for module in modules:
            method = getattr(module, "quant_method", None)
            if method is not None and hasattr(method, "process_weights_after_loading"):
                method.process_weights_after_loading(module)


def _views(buffer: torch.Tensor, info: ShmUpdateInfo) -> Iterator[tuple[str, torch.Tensor]]:
    for name, dtype_name, shape, offset in zip(
        info.names, info.dtype_names, info.shapes, info.offsets, strict=True
    ):
        dtype = getattr(torch, dtype_name)
        numel = 1
        for d in shape:
            numel *= d
        nbytes = numel * dtype.itemsize
        if offset + nbytes > buffer.numel():
            raise ValueError(
                f"{name}: bytes {offset}..{offset + nbytes} lie outside the shared file "
                f"({buffer.numel()} bytes)"
            )
        yield name, buffer[offset : offset + nbytes].view(dtype).view(shape)


@dataclass
class _Bucket:
    names: list[str] = field(default_factory=list)
    tensors: list[torch.Tensor] = field(default_factory=list)
    nbytes: int = 0


class ShmTrainerWeightTransferEngine(TrainerWeightTransferEngine[ShmTrainerInitInfo]):
    """The trainer side, vLLM's ``TrainerWeightTransferEngine`` for ``envhub_shm``: writes
    buckets into the shared file and drives the update round trip."""

    init_info_cls = ShmTrainerInitInfo

    def __init__(
        self, *, client: VLLMWeightSyncClient, source: WeightSource, init_info: ShmTrainerInitInfo
    ) -> None:
        super().__init__(client=client, source=source, is_sender=init_info.is_sender)
        self.bucket_bytes = init_info.bucket_bytes
        self.directory = Path(init_info.directory) if init_info.directory else None
        self.path: Path | None = None
        self._file_bytes = 0
        self.buckets_sent = 0
        """Buckets of the last :meth:`send_weights`."""
        self.bytes_sent = 0

    @classmethod
    def trainer_init(
        cls,
        init_info: ShmTrainerInitInfo,
        *,
        client: VLLMWeightSyncClient,
        source: WeightSource | None = None,
    ) -> ShmTrainerWeightTransferEngine:
        """vLLM's trainer-side factory: build the engine and, on the sending rank, have every
        vLLM worker set up its side (:class:`ShmInitInfo`). The shared file is created on the
        first send.

        Raises:
            ValueError: ``source`` is ``None``: this backend resends the full weights each
                round, so it needs a ``WeightSource``.
        """
        if source is None:
            raise ValueError("envhub_shm needs a WeightSource")
        engine = cls(client=client, source=source, init_info=init_info)
        if engine.is_sender:
            client.init_weight_transfer_engine(asdict(ShmInitInfo()))
        return engine

    def send_weights(self) -> None:
        """One full update: ``start``, one ``update_weights`` per bucket, ``finish``."""
        assert self.source is not None
        if not self.is_sender:
            for _ in self.source.iter_groups():  # keep collectives aligned; nothing to ship
                pass
            return
        self.buckets_sent = self.bytes_sent = 0
        self.client.start_weight_update()
        try:
            for bucket in self._buckets():
                self._ship(bucket)
        finally:
            # A failed bucket leaves the worker's layerwise reload half done: finishing it
            # restores the layers that got nothing, and the verification step says what broke.
            self.client.finish_weight_update()

    def shutdown(self) -> None:
        """Delete the shared file (freeing its memory in ``/dev/shm``); idempotent."""
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            self.path = None

    def _buckets(self) -> Iterator[_Bucket]:
        bucket = _Bucket()
        assert self.source is not None
        for names, tensors in self.source.iter_groups():
            tensors = [t.detach().contiguous().cpu() for t in tensors]
            size = sum(_aligned(t.nbytes) for t in tensors)
            if bucket.names and bucket.nbytes + size > self.bucket_bytes:
                yield bucket
                bucket = _Bucket()
            bucket.names += names
            bucket.tensors += tensors
            bucket.nbytes += size
        if bucket.names:
            yield bucket

    def _ship(self, bucket: _Bucket) -> None:
        path = self._file(bucket.nbytes)
        offsets: list[int] = []
        with open(path, "r+b") as f:
            mapped = mmap.mmap(f.fileno(), 0)
            try:
                buffer = torch.frombuffer(mapped, dtype=torch.uint8)
                offset = 0
                for tensor in bucket.tensors:
                    offsets.append(offset)
                    buffer[offset : offset + tensor.nbytes].copy_(tensor.view(-1).view(torch.uint8))
                    offset += _aligned(tensor.nbytes)
                del buffer
            finally:
                mapped.close()
        info = ShmUpdateInfo(
            path=str(path),
            names=bucket.names,
            dtype_names=[str(t.dtype).removeprefix("torch.") for t in bucket.tensors],
            shapes=[list(t.shape) for t in bucket.tensors],
            offsets=offsets,
        )
        self.client.update_weights(asdict(info))
        self.buckets_sent += 1
        self.bytes_sent += bucket.nbytes

    def _file(self, nbytes: int) -> Path:
        """The shared file, grown to hold ``nbytes`` (a layer larger than the bucket size gets
        a bucket of its own)."""
        if self.path is None:
            directory = self.directory or _shared_directory(max(nbytes, self.bucket_bytes))
            _remove_orphans(directory)
            self.path = directory / f"envhub-weights-{os.getpid()}-{uuid.uuid4().hex[:8]}.bin"
            self.path.touch()
        if nbytes > self._file_bytes:
            os.truncate(self.path, nbytes)
            self._file_bytes = nbytes
        return self.path


def _remove_orphans(directory: Path) -> None:
    """Delete shared files left by trainers that were killed (their pid is gone): memory in
    ``/dev/shm`` stays taken until someone does."""
    for path in directory.glob("envhub-weights-*-*.bin"):
        pid = path.name.split("-")[2]
        if pid.isdigit() and not exists(int(pid)):
            path.unlink(missing_ok=True)


def _aligned(nbytes: int) -> int:
    return (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN


def _shared_directory(nbytes: int) -> Path:
    """``/dev/shm`` (memory) when it has room for two buckets, else the temp folder (page cache)."""
    shm = Path("/dev/shm")
    try:
        stats = os.statvfs(shm)
        if stats.f_bavail * stats.f_frsize > 2 * nbytes:
            return shm
    except OSError:
        pass
    return Path(tempfile.gettempdir())


def register() -> None:
    """The ``vllm.general_plugins`` hook: make ``envhub_shm`` a weight-transfer backend in this
    process (vLLM calls it in its API server, engine core and worker processes)."""
    from vllm.distributed.weight_transfer.factory import (
        WeightTransferEngineFactory,
        WeightTransferTrainerFactory,
    )

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, ShmWeightTransferEngine)
    if BACKEND not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(BACKEND, ShmTrainerWeightTransferEngine)
