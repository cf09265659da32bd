"""Several LoRA adapters on one base model: one copy of the frozen base weights for every
training model of the service that adapts it.

A :class:`SharedBase` is one torch backend whose PEFT model holds an adapter per training
model. The first adapter is the one the backend is built with (PEFT's ``default``); each
later one is added beside it (``add_adapter``), its initialisation seeded the same way, so an
adapter starts exactly as it would on a base of its own. Before every piece of work the
trainer thread makes that model's adapter the active one (:meth:`SharedBase.use`): PEFT then
runs only that adapter in the forward pass and gives only its tensors gradients, so the
others keep their weights and pending gradients. Each adapter has its own optimizer
(``training.py``). When its model's session ends the adapter is deleted from the base
(:meth:`SharedBase.remove`), and the service drops the base with its last adapter.

Tensors are named as on a base of their own (the adapter's name replaced by ``default``), so a
saved state loads into any adapter of the same shape, on this base or another.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from envhub.trainer.backends.torch_backend import TorchBackend

FIRST = "default"
"""PEFT's name of the adapter a backend is built with."""


class SharedBase:
    """One base model's backend and the LoRA adapters trained on it.

    Args:
        backend: A torch backend built with a LoRA adapter (its ``default``), not yet claimed.
    """

    def __init__(self, backend: TorchBackend) -> None:
        self.backend = backend
        self.adapters: list[str] = []
        """The adapters claimed, in order."""
        self._names = itertools.count(1)

    def add(self, lora: Any, seed: int) -> str:
        """A new adapter of ``lora``'s shape (``LoraSpec``), initialised from ``seed`` as on a
        base of its own; return its name."""
        if not self.adapters:  # the backend's own, seeded when it was built
            name = FIRST
        else:
            from peft import LoraConfig

            name = f"adapter-{next(self._names)}"
            settings = self.backend.config.model.lora
            torch.manual_seed(seed)
            self.backend.model.add_adapter(name, LoraConfig(
                r=lora.rank, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                target_modules=lora.target_modules(), task_type="CAUSAL_LM",
            ))  # fmt: skip
        self.adapters.append(name)
        return name

    def remove(self, name: str) -> None:
        """Delete adapter ``name`` and its tensors (its model is gone). The last one is left in
        place: the service drops the whole base with it."""
        self.adapters.remove(name)
        if self.adapters:
            self.use(self.adapters[0])  # PEFT warns when the active adapter is deleted
            self.backend.model.delete_adapter(name)

    def use(self, name: str) -> None:
        """Make ``name`` the adapter the model runs and trains."""
        model = self.backend.model
        if model.active_adapter != name:
            model.set_adapter(name)

    def parameters(self, name: str) -> list[tuple[str, torch.nn.Parameter]]:
        """Adapter ``name``'s tensors, by the names they have on a base of their own."""
        marker = f".{name}."
        return [
            (n.replace(marker, f".{FIRST}."), p)
            for n, p in self.backend.model.named_parameters()
            if ".lora_" in n and marker in n
        ]
