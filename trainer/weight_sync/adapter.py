"""LoRA runs send the adapter alone: vLLM serves the frozen base model with the policy's
adapter on top, reloaded in place after each optimizer step.

A LoRA run trains a few million parameters; a merged sync would send every weight of the model
each step (0.5 GB for SmolLM2-135M in float32). Here each sync writes the adapter in PEFT's
format to a folder of the run (``adapter_model.safetensors``: ~10-40 MB for a small model at
rank 8-16) and asks each engine to load it there (vLLM's ``/v1/load_lora_adapter`` with
``load_inplace``); requests name the adapter from then on. The engines must see the folder:
``vllm serve`` processes on the trainer's host (``rollout.vllm.mode: server``).

When it pays: on GPUs vLLM applies adapters with fused kernels at little cost. On the CPU its
LoRA layers are plain torch and generation ran 2x slower than the merged model (SmolLM2-135M,
2 cores, measured), far more than the ~1 s a merged sync costs, so ``lora_sync: auto`` merges
there.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from envhub.trainer.weight_sync.plan import SentWeights

ADAPTER_NAME = "policy-lora"
"""The name requests use for the policy once its adapter is loaded."""

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``--max-lora-rank`` values vLLM accepts."""


def engine_lora_rank(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that holds an adapter of ``rank``.

    Raises:
        ValueError: ``rank`` is above vLLM's largest.
    """
    for allowed in VLLM_LORA_RANKS:
        if rank <= allowed:
            return allowed
    raise ValueError(f"LoRA rank {rank} is above vLLM's largest ({VLLM_LORA_RANKS[-1]})")


class SavesAdapter(Protocol):
    """A backend that can write the policy's adapter (the torch backend)."""

    def save_adapter(self, target: Path) -> int:
        """Write the adapter to the folder ``target``; its size in bytes."""
        ...


class LoadsAdapter(Protocol):
    """An engine that can load an adapter (``ServerTransport``)."""

    async def load_adapter(self, name: str, path: str) -> None:
        """Load the adapter at ``path`` as ``name``."""
        ...


class AdapterSender:
    """A :class:`~.plan.WeightSender` that saves the adapter and has every engine load it.

    Args:
        backend: Writes the adapter.
        engines: Every engine of the policy.
        loop: The event loop the engines' calls belong to (``send`` runs in a worker thread).
        root: Where the adapters are written (default: a temporary folder, removed on close).
        timeout_s: How long an engine may take to load one.
    """

    description = "the LoRA adapter, sent by the trainer process"

    def __init__(
        self,
        backend: SavesAdapter,
        engines: Sequence[LoadsAdapter],
        loop: asyncio.AbstractEventLoop,
        root: Path | None = None,
        timeout_s: float = 600.0,
    ) -> None:
        self.backend, self.engines, self.loop = backend, list(engines), loop
        self.root = root or Path(tempfile.mkdtemp(prefix="envhub-lora-"))
        self.timeout_s = timeout_s
        self.syncs = 0

    def send(self) -> SentWeights:
        """Save the adapter to a new folder, have every engine load it, drop the last one."""
        self.syncs += 1
        folder = self.root / f"sync-{self.syncs:06d}"
        size = self.backend.save_adapter(folder)
        loads = [engine.load_adapter(ADAPTER_NAME, str(folder)) for engine in self.engines]
        future: Any = asyncio.run_coroutine_threadsafe(_all(loads), self.loop)
        future.result(self.timeout_s)
        previous = self.root / f"sync-{self.syncs - 1:06d}"
        shutil.rmtree(previous, ignore_errors=True)  # vLLM read it when it loaded it
        return SentWeights(1, size)

    def close(self) -> None:
        """Remove the adapters' folder."""
        shutil.rmtree(self.root, ignore_errors=True)


async def _all(calls: list[Any]) -> None:
    await asyncio.gather(*calls)
