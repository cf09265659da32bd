"""Run coroutines from sync code: the bridge behind ``Env.step`` for async-native envs."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
_local = threading.local()


def _thread_loop() -> asyncio.AbstractEventLoop:
    # One loop per thread, reused: asyncio.run() per call would cost a new loop every step.
    loop = getattr(_local, "loop", None)
    if loop is None or loop.is_closed():
        loop = asyncio.new_event_loop()
        _local.loop = loop
    return loop


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion from synchronous code.

    Inside a running event loop (a notebook, an async test) the coroutine runs on a helper
    thread with its own loop, since the caller's loop cannot be re-entered. That loop is
    closed when the call returns (the helper thread ends with it).
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _thread_loop().run_until_complete(coro)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


async def within(seconds: float, coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` for at most ``seconds``; ``TimeoutError`` (no message) after that.

    Not ``asyncio.wait_for``: before Python 3.12 it can swallow a cancellation of its caller
    when the awaited coroutine finishes at the same moment, and a runner's episode timeout
    (a ``wait_for`` around steps that are each in a ``wait_for``) then never fires (seen under
    load: an endless episode). ``asyncio.timeout`` (3.11+) has no such race; on 3.10 the
    coroutine runs as a task that is cancelled at the deadline.
    """
    if hasattr(asyncio, "timeout"):
        async with asyncio.timeout(seconds):
            return await coro
    task = asyncio.ensure_future(coro)
    try:
        await asyncio.wait({task}, timeout=seconds)
    finally:  # our own cancellation, or the deadline: the work stops either way
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
    if task.cancelled():
        raise TimeoutError
    return task.result()


class FirstInIteration:
    """Tells whether a caller is the first of the running event loop's iteration to ask: the
    first frame of an iteration goes out at once, those made after it in the same iteration
    are gathered into one (the serve client's and server's batching)."""

    def __init__(self) -> None:
        self._taken = False

    def take(self) -> bool:
        """``True`` for the first call in this loop iteration (and only for it)."""
        if self._taken:
            return False
        self._taken = True
        asyncio.get_running_loop().call_soon(self._next_iteration)
        return True

    def _next_iteration(self) -> None:
        self._taken = False
