"""The local backend's uid pool: which uid a run gets, claimed machine-wide.

As root, each concurrent run gets a uid of its own (RLIMIT_NPROC counts per uid, so runs that
shared one would share a process limit): a :class:`UidPool` holds ``size`` uids from ``base``
upwards that no other process on the machine holds, each claimed by a lock on a file in
:data:`CLAIMS` for as long as this process lives. Sandboxes with the same range share one pool
(:func:`uid_pool`). A forked child must not use its parent's uids (the parent goes on using
them): it forgets the pools (:func:`forget_pools`) and each sandbox takes
:meth:`UidPool.reclaimed`, a pool of other uids.

When envhub is not root the pool repeats the caller's own uid (``step=0``): it then only bounds
how many runs go at once.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path

from envhub.errors import SandboxError


class UidPool:
    """Hands out ``size`` uids from ``base`` upwards that no other process holds (see
    :func:`_claim`), one per concurrent run, across threads and event loops. ``step=0``
    repeats the one uid ``base`` (a concurrency bound only)."""

    def __init__(self, base: int, size: int, step: int = 1) -> None:
        self._range = (base, size, step)
        self.base = base
        """The first uid of the pool's range."""
        self.exclusive = bool(step)
        """Whether each uid is one run's alone (as root), not the caller's own repeated."""
        self.uids: tuple[int, ...] = tuple(_claim(base, size) if step else [base] * size)
        """Every uid of the pool, free or not."""
        self._free = list(reversed(self.uids))
        self._lock = threading.Lock()
        self._waiting = 0
        self._warm: set[int] = set()

    @property
    def waiting(self) -> int:
        """Calls of :meth:`acquire` waiting for a uid now."""
        return self._waiting

    @property
    def warm(self) -> frozenset[int]:
        """Uids held by warm sandboxes (started ahead, running no call yet), of any
        :class:`~envhub.sandbox.LocalSandbox` sharing this pool."""
        with self._lock:
            return frozenset(self._warm)

    def mark_warm(self, uid: int) -> None:
        """Count ``uid`` among :attr:`warm` (a warm sandbox holds it)."""
        with self._lock:
            self._warm.add(uid)

    def unmark_warm(self, uids: Iterable[int]) -> None:
        """Count ``uids`` no longer among :attr:`warm`."""
        with self._lock:
            self._warm.difference_update(uids)

    async def acquire(self) -> int:
        """A free uid, waiting (polling) while there is none."""
        delay = 0.001
        if (uid := self.try_acquire()) is not None:
            return uid
        with self._lock:
            self._waiting += 1
        try:
            while True:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.02)
                if (uid := self.try_acquire()) is not None:
                    return uid
        finally:
            with self._lock:
                self._waiting -= 1

    def try_acquire(self) -> int | None:
        """A free uid, or ``None`` when there is none now."""
        with self._lock:
            return self._free.pop() if self._free else None

    def release(self, uid: int) -> None:
        """Give ``uid`` back (its caller has made sure it owns no process)."""
        with self._lock:
            self._free.append(uid)

    def reclaimed(self) -> UidPool:
        """The process-wide pool of this one's range: in a forked child after
        :func:`forget_pools`, a new one with other uids (the parent goes on using these)."""
        return uid_pool(*self._range)


CLAIMS = Path(tempfile.gettempdir()) / "envhub-sandbox-uids"
"""One lock file per uid in use: other processes on the machine skip uids locked here."""
_CLAIM_RANGE = 4096


def _claim(base: int, size: int) -> list[int]:
    """``size`` uids from ``base`` upwards that no other process holds, each held by a lock on
    a file in :data:`CLAIMS` for as long as this process lives (the kernel drops the locks
    when it dies, however it dies)."""
    CLAIMS.mkdir(mode=0o700, exist_ok=True)
    uids: list[int] = []
    for uid in range(base, base + _CLAIM_RANGE):
        fd = os.open(CLAIMS / f"{uid}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        _HELD.append(fd)
        uids.append(uid)
        if len(uids) == size:
            return uids
    raise SandboxError(
        f"no {size} free sandbox uids in {base}..{base + _CLAIM_RANGE - 1}; "
        "other envhub processes hold them"
    )


_HELD: list[int] = []
_POOLS: dict[tuple[int, int, int], UidPool] = {}
_POOLS_LOCK = threading.Lock()


def forget_pools() -> None:
    """Forget every pool (in a forked child: the parent goes on using their uids; pools made
    after this claim others)."""
    global _POOLS_LOCK
    _POOLS.clear()
    _KEEPERS.clear()
    _POOLS_LOCK = threading.Lock()


def uid_pool(base: int, size: int, step: int = 1) -> UidPool:
    """The process-wide pool for a uid range (sandboxes with the same range share it)."""
    with _POOLS_LOCK:
        if (base, size, step) not in _POOLS:
            _POOLS[base, size, step] = UidPool(base, size, step)
        return _POOLS[base, size, step]


_KEEPERS: dict[int, int] = {}


def keeper_uid(base: int) -> int:
    """A uid of ``base``'s range claimed for this process alone (as a pool's uids are, and
    never in a pool): the real uid of its local sessions' inits. No process of a sandbox has
    it, so none can signal or trace them (:mod:`envhub.sandbox.session_init`)."""
    with _POOLS_LOCK:
        if base not in _KEEPERS:
            _KEEPERS[base] = _claim(base, 1)[0]
        return _KEEPERS[base]
