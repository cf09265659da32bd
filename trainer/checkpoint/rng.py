"""Random number generators: capture every state a training step may draw from, and restore it.

A resumed run draws the same numbers as one that never stopped only if every generator is put
back: python's ``random``, numpy's global legacy generator, torch's CPU generator and each CUDA
device's.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import numpy as np
import torch

# One logger for the package, named as before it was split into modules, so log filters and
# formats that name ``envhub.trainer.checkpoint`` see the same records.
log = logging.getLogger(__package__)


def capture_rng() -> dict[str, Any]:
    """The state of every generator a training step may draw from.

    Returns:
        ``python`` (``random``), ``numpy`` (the global legacy generator), ``torch`` (CPU) and,
        when CUDA is available, ``cuda`` (one state per device). The values survive
        ``torch.save`` / ``torch.load(weights_only=True)``.
    """
    numpy = np.random.get_state(legacy=False)
    key, pos = numpy["state"]["key"].tolist(), numpy["state"]["pos"]  # weights_only refuses arrays
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {**numpy, "state": {"key": key, "pos": pos}},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Put every generator back where ``capture_rng`` found it.

    Args:
        state: A dict from ``capture_rng``. CUDA states are restored on as many devices as both
            the state and this machine have; a mismatch is logged, not an error.
    """
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy = state["numpy"]
    key = np.asarray(numpy["state"]["key"], dtype=np.uint32)
    np.random.set_state({**numpy, "state": {"key": key, "pos": numpy["state"]["pos"]}})
    torch.set_rng_state(state["torch"].cpu())
    cuda = state.get("cuda")
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if cuda is not None and len(cuda) != available:
        log.warning("CUDA RNG states for %d devices, this machine has %d", len(cuda), available)
    for device, device_state in enumerate((cuda or [])[:available]):
        torch.cuda.set_rng_state(device_state.cpu(), device)
