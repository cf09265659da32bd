"""The weight transfers envhub can use: one module each, found by name.

A module ``transfers/NAME.py`` that defines ``TRANSFER`` (a :class:`~..plan.Transfer`) is the
transfer ``NAME``: ``rollout.vllm.weight_transfer: NAME`` selects it and nothing else needs to
know of it. Modules are imported only when their transfer is asked for (the names come from the
file names), so choosing one needs neither torch nor vLLM.
"""

from __future__ import annotations

import difflib
import pkgutil
from functools import cache
from importlib import import_module

from envhub.errors import ConfigError
from envhub.trainer.weight_sync.plan import Transfer

AUTO = "auto"


def names() -> list[str]:
    """Every transfer's name (the modules of this package)."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


@cache
def get(name: str) -> Transfer:
    """The transfer ``name``, or a :class:`ConfigError` that lists the others."""
    known = names()
    if name not in known:
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(
            f"unknown weight transfer {name!r}{hint}; available: {AUTO}, {', '.join(known)}"
        )
    return import_module(f"{__name__}.{name}").TRANSFER


def choose(requested: str, *, on_gpu: bool, shares_gpu: bool) -> str:
    """The transfer for ``requested``.

    ``auto`` picks shared memory (``envhub_shm``) on the CPU, CUDA IPC to an engine on the
    trainer's GPU (``shares_gpu``: in its process, or colocated; NCCL cannot put two ranks on one
    GPU), NCCL to a GPU server of its own.
    """
    if requested != AUTO:
        if get(requested).needs_gpu and not on_gpu:
            raise ConfigError(
                f"rollout.vllm.weight_transfer={requested} needs CUDA GPUs; "
                "on the CPU use envhub_shm (or auto)"
            )
        return requested
    if not on_gpu:
        return "envhub_shm"
    return "ipc" if shares_gpu else "nccl"
