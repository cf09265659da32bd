"""The I/O loop: an event loop in a daemon thread, where sync code's requests run."""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from envhub.serve.client import pool

logger = logging.getLogger(__name__)

T = TypeVar("T")


class IOLoop:
    """An event loop in a daemon thread, started on first use."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def loop(self) -> asyncio.AbstractEventLoop:
        """The running I/O loop."""
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(
                    target=self._loop.run_forever, name="envhub-remote-io", daemon=True
                ).start()
                atexit.register(self._close_at_exit)
            return self._loop

    def _close_at_exit(self) -> None:
        """Close the connections of envs never closed: their servers end those sessions now,
        not at their TTL, and aiohttp does not log an unclosed pool at exit."""
        if self._loop is None or not pool.shared:
            return
        try:
            asyncio.run_coroutine_threadsafe(pool.close_shared(), self._loop).result(timeout=2)
        except Exception:  # the process is exiting: nothing is left to tell
            logger.debug("closing the remote envs' connections at exit failed", exc_info=True)

    def is_current(self) -> bool:
        """Whether the caller runs on the I/O loop."""
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the I/O loop and wait for its result (sync code)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop()).result()

    async def arun(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the I/O loop and await its result from another loop; cancelling
        the caller cancels it."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop()))


IO = IOLoop()
