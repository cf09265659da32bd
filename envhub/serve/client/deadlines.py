"""Request time-outs, kept by one timer per transport."""

from __future__ import annotations

import asyncio
import math
from typing import Any

TIMED_OUT: Any = object()
"""What a request's future holds when its time ran out."""


class Deadlines:
    """Time-outs of a transport's requests, kept by one timer: a watched future holds
    :data:`TIMED_OUT` once its time is up, noticed within a quarter of the shortest timeout
    being watched. A timer per request, armed and cancelled every time (and the heap of
    cancelled timers the loop then sifts), cost ~6 of the client's ~30 us per step at 64
    sessions."""

    def __init__(self) -> None:
        self._due: dict[asyncio.Future[Any], float] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._tick = math.inf

    def watch(
        self, answer: asyncio.Future[Any], timeout: float, loop: asyncio.AbstractEventLoop
    ) -> None:
        """Time ``answer`` out after ``timeout`` seconds (or up to a tick later)."""
        self._due[answer] = loop.time() + timeout
        tick = max(timeout / 4, 0.005)
        if tick < self._tick:  # checks must come more often: re-arm
            self._tick = tick
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        if self._timer is None:
            self._timer = loop.call_later(self._tick, self._check, loop)

    def forget(self, answer: asyncio.Future[Any]) -> None:
        """Stop watching ``answer`` (it was answered, or failed)."""
        self._due.pop(answer, None)

    def _check(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        for answer in [a for a, due in self._due.items() if due <= now]:
            del self._due[answer]
            if not answer.done():
                answer.set_result(TIMED_OUT)
        if self._due:
            self._timer = loop.call_later(self._tick, self._check, loop)
        else:
            self._timer, self._tick = None, math.inf
