"""The runner's relaxed garbage collection is scoped: nested and concurrent scopes restore the
collector exactly as they found it, and leave a process's own freeze alone."""

from __future__ import annotations

import gc
import threading

from envhub.rollout.gc_scope import relaxed_gc


def scanned(obj: object) -> bool:
    """Whether the collector scans ``obj`` (frozen objects are in no generation)."""
    return any(o is obj for o in gc.get_objects())


def test_nested_scopes_freeze_once_and_restore_on_the_outermost_exit() -> None:
    before = gc.get_threshold()
    old: list[object] = []
    assert gc.get_freeze_count() == 0
    with relaxed_gc(first_generation=40_000):
        assert not scanned(old)
        assert gc.get_threshold() == (max(before[0], 40_000), *before[1:])
        new: list[object] = []
        with relaxed_gc():
            assert scanned(new)  # an inner scope freezes nothing more
        assert gc.get_threshold()[0] == max(before[0], 40_000)
    assert (gc.get_threshold(), gc.get_freeze_count()) == (before, 0)
    assert scanned(old)


def test_scopes_from_threads_overlap_and_the_last_one_out_restores() -> None:
    before = gc.get_threshold()
    inside, leave = threading.Event(), threading.Event()

    def worker() -> None:
        with relaxed_gc():
            inside.set()
            leave.wait(10)

    thread = threading.Thread(target=worker)
    with relaxed_gc():
        thread.start()
        assert inside.wait(10)
    assert gc.get_freeze_count() > 0  # the worker's scope is still open
    leave.set()
    thread.join(10)
    assert (gc.get_threshold(), gc.get_freeze_count()) == (before, 0)


def test_a_process_that_froze_objects_itself_stays_frozen() -> None:
    theirs: list[object] = []
    gc.freeze()
    try:
        ours: list[object] = []
        with relaxed_gc():
            assert scanned(ours)  # not frozen: the process manages its own freeze
        assert not scanned(theirs)
    finally:
        gc.unfreeze()


def test_a_higher_threshold_of_the_process_is_kept() -> None:
    before = gc.get_threshold()
    gc.set_threshold(90_000, *before[1:])
    try:
        with relaxed_gc(first_generation=50_000):
            assert gc.get_threshold()[0] == 90_000
        assert gc.get_threshold()[0] == 90_000
    finally:
        gc.set_threshold(*before)
