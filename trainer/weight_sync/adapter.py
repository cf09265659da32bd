"""LoRA runs send the adapter alone: vLLM serves the frozen base model with the policy's
adapter on top, loaded anew after each optimizer step.

A LoRA run trains a few million parameters; a merged sync would send every weight of the model
each step (0.5 GB for SmolLM2-135M in float32). Here each sync writes the adapter in PEFT's
format to a folder (``adapter_model.safetensors``: ~10-40 MB for a small model at rank 8-16)
and asks each engine to load it as a new version (vLLM's ``/v1/load_lora_adapter``,
``policy-lora-N``); requests name the newest from then on, and the one before is unloaded and
its folder removed. (Built for ``max_staleness + 1`` versions at once, requests in flight
keeping the one they started with; asynchronous runs are refused for now, see
``TrainConfig.adapter_sync_problem``.) Not in place: vLLM re-reads an adapter loaded
in place from disk at every forward step (vLLM 0.32). The engines must see the folder: ``vllm
serve`` processes on the trainer's host (``rollout.vllm.mode: server``).

When it pays: on GPUs vLLM applies adapters with fused kernels at little cost. On the CPU its
LoRA layers are plain torch and generation ran 2.25x slower than the merged model
(SmolLM2-135M, rank 16, 2 cores: 72 against 162 tokens/s, ``bench/lora_sync.py``), far more
than the ~0.9 s a merged sync costs, so ``lora_sync: auto`` merges there.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from envhub.lifetime.tempdirs import owned_tempdir
from envhub.trainer.weight_sync.plan import SentWeights

ADAPTER_PREFIX = "policy-lora"
"""Requests name the policy ``policy-lora-N`` once the adapter of sync N is loaded."""

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
    """An engine that can load adapters (``ServerTransport``)."""

    async def load_adapter(self, name: str, path: str) -> None:
        """Load the adapter at ``path`` as ``name``; requests name it from now on."""
        ...

    async def unload_adapter(self, name: str) -> None:
        """Forget the adapter ``name``."""
        ...


class AdapterSender:
    """A :class:`~.plan.WeightSender` that saves the adapter and has every engine load it.

    Args:
        backend: Writes the adapter.
        engines: Every engine of the policy.
        loop: The event loop the engines' calls belong to (``send`` runs in a worker thread).
        slots: Versions the engines hold at once (``max_staleness + 1``).
        root: Where the adapters are written (default: a temporary folder, removed on close).
        timeout_s: How long an engine may take to load one.
    """

    description = "the LoRA adapter, sent by the trainer process"

    def __init__(
        self,
        backend: SavesAdapter,
        engines: Sequence[LoadsAdapter],
        loop: asyncio.AbstractEventLoop,
        slots: int = 1,
        root: Path | None = None,
        timeout_s: float = 600.0,
    ) -> None:
        self.backend, self.engines, self.loop = backend, list(engines), loop
        self.slots = slots
        self.root = root or Path(owned_tempdir("envhub-lora-"))  # a killed run's: removed later
        self.timeout_s = timeout_s
        self.syncs = 0

    def send(self) -> SentWeights:
        """Save the adapter as the next version, have every engine load it, and drop the
        version that no request may use any more."""
        self.syncs += 1
        size = self.backend.save_adapter(self.folder(self.syncs))
        self._on_engines(
            engine.load_adapter(adapter_name(self.syncs), str(self.folder(self.syncs)))
            for engine in self.engines
        )
        retired = self.syncs - self.slots
        if retired >= 1:
            name = adapter_name(retired)
            self._on_engines(engine.unload_adapter(name) for engine in self.engines)
            shutil.rmtree(self.folder(retired), ignore_errors=True)
        return SentWeights(1, size)

    def folder(self, sync: int) -> Path:
        """Where the adapter of ``sync`` is written."""
        return self.root / f"sync-{sync:06d}"

    def _on_engines(self, calls: Iterable[Any]) -> None:
        future: Any = asyncio.run_coroutine_threadsafe(_all(list(calls)), self.loop)
        future.result(self.timeout_s)

    def close(self) -> None:
        """Remove the adapters' folder."""
        shutil.rmtree(self.root, ignore_errors=True)


def adapter_name(sync: int) -> str:
    """The name of the adapter of ``sync`` on the engines."""
    return f"{ADAPTER_PREFIX}-{sync}"


async def _all(calls: list[Any]) -> None:
    await asyncio.gather(*calls)
