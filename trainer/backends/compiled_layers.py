"""Regional compilation: each decoder layer ``torch.compile``d, one compiled block for all.

A 0.5B update on an H200 launched ~2,650 small kernels per micro-batch, the device idle while
the host launched them. Compiled, a layer's norms, rotary embedding, activations and residual
adds fuse into a few Triton kernels. Every layer is an instance of the same class and dynamo
reads parameters as inputs, so the code compiled for the first layer serves the others: the
compile time is one layer's, not the model's.

A new input length makes dynamo compile again; after the second length it compiles one kernel
for any length (automatic dynamic shapes). :func:`bucket_length` pads lengths up to a few
sizes per doubling (at most 1/8 more tokens) so that the kernels inductor picks for a length
serve many micro-batches.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable

import torch

BUCKETS_PER_DOUBLING = 8
"""Lengths between ``2^k`` and ``2^(k+1)`` are padded to a multiple of ``2^(k+1) / 8``."""


def bucket_length(length: int, minimum: int = 16) -> int:
    """``length`` rounded up to its bucket: a multiple of ``2^ceil(log2 length) / 8`` (at least
    ``minimum``), so at most 1/8 of the result is padding above ``8 x minimum``."""
    if length <= minimum:
        return minimum
    granule = bucket_granule(length, minimum)
    return -(-length // granule) * granule


def bucket_granule(length: int, minimum: int = 16) -> int:
    """What :func:`bucket_length` rounds ``length`` up to a multiple of."""
    return max(minimum, 2 ** math.ceil(math.log2(max(length, 1))) // BUCKETS_PER_DOUBLING)


def compile_layers(layers: Iterable[torch.nn.Module], backend: str = "inductor") -> int:
    """Compile each module of ``layers`` in place (``nn.Module.compile``: the module keeps its
    parameters, names and state dict); return how many.

    Args:
        layers: The decoder layers (an HF model's ``model.get_decoder().layers``, a Megatron
            ``TransformerBlock.layers``).
        backend: The ``torch.compile`` backend (``inductor``; the tests count compilations with
            ``eager``).
    """
    count = 0
    for layer in layers:
        layer.compile(backend=backend)
        count += 1
    return count


def compile_seconds() -> float:
    """Seconds this process has spent in ``torch.compile`` so far (dynamo's tracing and the
    backend's compiler, forward graphs and backward graphs)."""
    from torch._dynamo.utils import compilation_time_metrics

    return sum(
        sum(times)
        for name, times in compilation_time_metrics.items()
        if name == "_compile.compile_inner" or name.endswith("bw_compiler")
    )


def compiled_frames() -> int:
    """Frames dynamo has compiled in this process (each a graph; a recompilation counts)."""
    from torch._dynamo.utils import counters

    return int(counters["frames"]["ok"])


class CompileTime:
    """The process's compile seconds for a step's metrics (``train/compile_s``), logged when
    they grew since the last report (the first step, a new shape)."""

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self.reported = compile_seconds()

    def report(self) -> float:
        """:func:`compile_seconds` now; logged when it grew."""
        seconds = compile_seconds()
        if seconds > self.reported:
            self.log.info("torch.compile: %.1f s so far in this process", seconds)
            self.reported = seconds
        return seconds
