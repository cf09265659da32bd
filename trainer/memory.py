"""Giving the memory an update freed back to the operating system.

The loop runs each update in a worker thread (so that rollouts go on meanwhile). glibc serves a
thread from an arena of its own and keeps what torch frees there for reuse instead of returning
it, and the update's tensors differ in size from step to step, so the arena only grows: the
latency benchmark's process grew from 4.6 to 19 GiB in six SmolLM2 steps and was killed for
memory. ``malloc_trim`` returns the free pages of every arena; with it after each update the
process stayed at 2.6 GiB (a run with the update in the main thread settles at 5.4 GiB).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS, Windows)."""
    try:
        return getattr(ctypes.CDLL(None), "malloc_trim", None)
    except OSError:
        return None


def release_freed_memory() -> bool:
    """Return the C library's free memory to the OS; False where that is not possible."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
