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
