"""Python's cyclic garbage collector, relaxed while many episodes are in flight.

Episodes in flight hold many container objects (messages, token traces, tool calls, pydantic
models). With the default thresholds the collector runs its youngest generation every 700
allocations and its full collection whenever the older generations have grown by a quarter,
and each full collection scans every object of the process again: what was imported, a loaded
model, the episodes. At 1024 concurrent episodes that was about a fifth of the runner's time in
``bench/rollout_throughput.py``. Inside :func:`relaxed_gc` the objects alive at entry are frozen
(``gc.freeze``: never scanned, never freed) and the youngest generation is collected every
50,000 allocations; both are undone when the outermost scope exits, so what was frozen can be
collected again afterwards. A process that froze objects itself is left frozen as it was.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_depth = 0
_saved_threshold: tuple[int, int, int] = (700, 10, 10)
_froze = False


@contextlib.contextmanager
def relaxed_gc(first_generation: int = 50_000) -> Iterator[None]:
    """Freeze the objects alive now and collect the youngest generation every
    ``first_generation`` allocations (never more often than the process already does) until
    the outermost of nested or concurrent scopes exits; then restore both."""
    global _depth, _saved_threshold, _froze
    with _lock:
        if _depth == 0:
            _saved_threshold = gc.get_threshold()
            _froze = gc.get_freeze_count() == 0
            if _froze:
                gc.freeze()
            first, *older = _saved_threshold
            gc.set_threshold(max(first, first_generation), *older)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                gc.set_threshold(*_saved_threshold)
                if _froze:
                    gc.unfreeze()
