"""Hand values between event loops on different threads with one wake-up each.

The endpoint's loop receives an agent's call and the runner's loop samples the reply; both
directions used to go through ``asyncio.run_coroutine_threadsafe`` (a task on the other loop, a
concurrent future, and a wrapped future back: several callbacks and a second wake-up per hop).
A :class:`Mailbox` delivers an item with one ``call_soon_threadsafe`` on the consumer's loop,
and :func:`settle` resolves a future owned by another loop the same way.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class MailboxClosed(Exception):
    """The mailbox was closed while (or before) waiting on it."""


class Mailbox(Generic[T]):
    """Items put from any thread, taken by one consumer awaiting on its own loop, in order.

    Closing it hands back what was never taken (so the producer's waiting calls can be failed)
    and refuses later puts, under one lock: an item is either taken or handed back, never lost.

    Args:
        orphaned: Called (on the consumer's loop) with an item that was on its way to a
            :meth:`get` cancelled meanwhile, when the mailbox was closed before it landed.
    """

    def __init__(self, orphaned: Callable[[T], None] | None = None) -> None:
        self._orphaned = orphaned
        self._lock = threading.Lock()
        self._items: deque[T] = deque()
        self._waiter: asyncio.Future[T] | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def put(self, item: T) -> bool:
        """Deliver ``item`` (from any thread); ``False`` if the mailbox is closed."""
        with self._lock:
            if self._closed:
                return False
            waiter, self._waiter = self._waiter, None
            if waiter is None or waiter.done():
                self._items.append(item)
                return True
        try:
            waiter.get_loop().call_soon_threadsafe(self._deliver, waiter, item)
        except RuntimeError:  # the consumer's loop is closed: the next get takes it
            with self._lock:
                self._items.appendleft(item)
        return True

    async def get(self) -> T:
        """The next item, waiting on the current loop for one.

        Raises:
            MailboxClosed: The mailbox is (or gets) closed with nothing left to take.
        """
        with self._lock:
            if self._items:
                return self._items.popleft()
            if self._closed:
                raise MailboxClosed
            waiter = asyncio.get_running_loop().create_future()
            self._waiter = waiter
        return await waiter

    def close(self) -> list[T]:
        """Refuse further puts, wake a waiting :meth:`get`, and return the items never taken."""
        with self._lock:
            self._closed = True
            left, self._items = list(self._items), deque()
            waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.get_loop().is_closed():
            waiter.get_loop().call_soon_threadsafe(_fail, waiter, MailboxClosed())
        return left

    def _deliver(self, waiter: asyncio.Future[T], item: T) -> None:
        """On the consumer's loop: resolve its wait, or keep the item if it stopped waiting."""
        if not waiter.done():
            waiter.set_result(item)
            return
        with self._lock:  # the get was cancelled meanwhile: the item goes first in line
            if not self._closed:
                self._items.appendleft(item)
                return
        if self._orphaned is not None:
            self._orphaned(item)


def settle(future: asyncio.Future[T], outcome: T | BaseException) -> None:
    """Resolve ``future`` (owned by any loop, from any thread) with a value or an exception;
    a future already done (its waiter gave up) is left as it is."""
    future.get_loop().call_soon_threadsafe(_resolve, future, outcome)


def _resolve(future: asyncio.Future[T], outcome: T | BaseException) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


def _fail(future: asyncio.Future[T], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
