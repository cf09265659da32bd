"""What leaves a Megatron rank and comes back: the HF weights (whole, streamed, or through the
weight transfer to vLLM), the exported HF folder, and the distributed checkpoint. Methods of
:class:`~envhub.trainer.megatron.worker.MegatronWorker` (the driver calls them by name on every
rank), kept apart from its training."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from envhub.trainer.megatron.bridge import hf_weights
from envhub.trainer.megatron.torch_adam import unshare_steps
from envhub.trainer.megatron.worker_spec import WorkerSpec
from envhub.trainer.weight_sync.plan import TransferPlan

if TYPE_CHECKING:
    from envhub.trainer.weight_sync.ranks import RankTransfer

WORKER_STATE = "envhub_worker.json"
"""Written next to the distributed checkpoint: the update counter (and the mark of a
complete Megatron checkpoint)."""

CHECKPOINT_METADATA = {"distrib_optim_sharding_type": "fully_reshardable"}
"""How the distributed optimizer (GPU runs) lays out its checkpoint: one tensor per parameter, so
any tensor/pipeline/data split can load it. megatron-core 0.19's default
(``fully_sharded_model_space``) fails to save ("ShardedTensor.flattened_range is not
supported"); the single-process optimizers (CPU runs) ignore it."""


class WeightsAndCheckpoints:
    """The weights' and checkpoints' half of a rank (see the module docstring)."""

    spec: WorkerSpec
    bridge: Any
    model: Any
    optimizer: Any
    updates: int
    _weight_stream: Iterator[tuple[str, torch.Tensor]] | None
    _transfer: RankTransfer | None
    _optimizer: Callable[[], Any]

    def hf_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The whole model under HF names on rank 0 (CPU tensors); ``None`` elsewhere."""
        weights = {
            name: tensor.detach().to("cpu", copy=True)
            for name, tensor in hf_weights(self.bridge, [self.model.module])
        }
        return weights if torch.distributed.get_rank() == 0 else None

    def begin_weights(self) -> None:
        """Start streaming the HF weights (see :meth:`next_weights`)."""
        self._weight_stream: Iterator[tuple[str, torch.Tensor]] | None = hf_weights(
            self.bridge, [self.model.module]
        )

    def next_weights(self, max_bytes: int) -> list[tuple[str, torch.Tensor]] | None:
        """The stream's next tensors, at least one and about ``max_bytes`` in all, on rank 0
        (``None`` on the others); ``[]`` on every rank when the stream is done. Every rank must
        call it: each tensor is gathered from its shards by collectives, so only one bucket is
        ever held at once."""
        if self._weight_stream is None:
            raise RuntimeError("call begin_weights first")
        chunk: list[tuple[str, torch.Tensor]] = []
        size = 0
        for name, tensor in self._weight_stream:  # the same tensors, in order, on every rank
            chunk.append((name, tensor.detach().to("cpu", copy=True)))
            size += tensor.numel() * tensor.element_size()
            if size >= max_bytes:
                break
        if not chunk:
            self._weight_stream = None
            return []
        return chunk if torch.distributed.get_rank() == 0 else None

    def connect_weight_transfer(self, plan: TransferPlan) -> dict[str, Any] | None:
        """Join the weight transfer that ``plan`` describes (``weight_sync.ranks``): rank 0
        sends straight to the engines (NCCL rendezvous on its node, CUDA IPC from its GPU, or the
        shared file on its host); every rank gathers the weights with it on each
        :meth:`send_weights`. Rank 0 returns where it sends from; the others ``None``."""
        from envhub.trainer.weight_sync.ranks import RankTransfer

        self.close_weight_transfer()
        rank = torch.distributed.get_rank()
        address = os.environ.get("MASTER_ADDR", "127.0.0.1")  # rank 0's node, where it listens
        self._transfer = RankTransfer.connect(
            plan, lambda: hf_weights(self.bridge, [self.model.module]), rank=rank, address=address
        )
        return {"rank": rank, "node": address, "pid": os.getpid()} if rank == 0 else None

    def send_weights(self) -> tuple[int, int] | None:
        """One sync over the connected transfer (every rank takes part); on rank 0 the buckets
        and bytes it sent (plain ints: they travel over Ray), else ``None``."""
        if self._transfer is None:
            raise RuntimeError("call connect_weight_transfer first")
        sent = self._transfer.send()
        return (sent.buckets, sent.bytes) if sent is not None else None

    def close_weight_transfer(self) -> None:
        """Leave the transfer (its shared file, communicator and HTTP clients); idempotent."""
        if self._transfer is not None:
            self._transfer.close()
            self._transfer = None

    def export(self, target: str) -> str | None:
        """Save the model as an HF folder (safetensors, config, tokenizer) from rank 0."""
        from envhub.trainer.checkpoint import export_hf_weights

        weights = self.hf_state_dict()
        if weights is None:
            return None
        return str(export_hf_weights(weights, self.spec.model_path, target))

    def save_checkpoint(self, folder: str) -> None:
        """Model and optimizer shards in Megatron's distributed format (every rank writes its
        part; ``folder`` must be on storage all nodes share), plus the update counter."""
        from megatron.core import dist_checkpointing

        Path(folder).mkdir(parents=True, exist_ok=True)
        dist_checkpointing.save(self._sharded_state(), folder)
        if torch.distributed.get_rank() == 0:
            (Path(folder) / WORKER_STATE).write_text(json.dumps({"updates": self.updates}))
        torch.distributed.barrier()

    def load_checkpoint(self, folder: str, optimizer: bool = True) -> None:
        """Fill the model and, with ``optimizer``, the optimizer from :meth:`save_checkpoint`'s
        folder, for any layout that splits the same model (the format is resharded on load);
        without ``optimizer`` the optimizer starts afresh (no moments)."""
        from megatron.core import dist_checkpointing

        state = (
            self._sharded_state(loading=True)
            if optimizer
            else {"model": self.model.module.sharded_state_dict()}
        )
        loaded = dist_checkpointing.load(state, folder)
        self.model.module.load_state_dict(loaded["model"])
        if optimizer:
            self.optimizer.load_state_dict(loaded["optimizer"])
            unshare_steps(self.optimizer)
        else:  # built again: its master weights (bf16 models) copy the loaded ones
            self.optimizer = self._optimizer()
        self.updates = json.loads((Path(folder) / WORKER_STATE).read_text())["updates"]

    def _sharded_state(self, loading: bool = False) -> dict[str, Any]:
        state = {"model": self.model.module.sharded_state_dict()}
        state["optimizer"] = self.optimizer.sharded_state_dict(
            state["model"], is_loading=loading, metadata=CHECKPOINT_METADATA
        )
        return state
