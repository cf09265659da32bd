"""Run coroutines from sync code: the bridge behind ``Env.step`` for async-native envs."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import sys
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


def close_thread_loop() -> None:
    """Close the loop :func:`run_sync` keeps for this thread, if it made one: for a thread
    that ends (the loop would otherwise be left to the garbage collector, unclosed)."""
    loop = getattr(_local, "loop", None)
    _local.loop = None
    if loop is not None and not loop.is_closed():
        loop.close()


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


def start_eagerly(coro: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
    """A task running ``coro``, whose first step runs now rather than at the loop's next
    iteration: a coroutine that finishes without waiting (a natively async env's step) has
    its result, and has done its work (sent its reply), before this returns (the future
    returned is done already); one that waits goes on as a task from where it waited.

    While the first step runs, the current task is the new task (as it would be for a task
    stepped by the loop), so ``asyncio.timeout``, ``asyncio.current_task()`` and cancellation
    inside ``coro`` concern it, not the caller; it runs in a copy of the caller's context.
    Python 3.12+ does this itself (``eager_start``); on 3.11 the first step runs here and the
    task's own coroutine carries on after it (:func:`_carry_on`); on 3.10, an ordinary task.
    """
    loop = asyncio.get_running_loop()
    if _EAGER_START:
        return asyncio.Task(coro, loop=loop, eager_start=True)  # type: ignore[call-arg]
    if _enter_task is None:
        return loop.create_task(coro)
    context = contextvars.copy_context()
    first = _FirstStep()
    task = loop.create_task(_carry_on(coro, first), context=context)
    outer = asyncio.current_task(loop)
    if outer is not None:
        _leave_task(loop, outer)
    _enter_task(loop, task)
    try:
        first.yielded = context.run(coro.send, None)
    except StopIteration as stop:
        first.done, first.result = True, stop.value
    except BaseException as error:  # the task raises it (its first step)
        first.done, first.error = True, error
    finally:
        _leave_task(loop, task)
        if outer is not None:
            _enter_task(loop, outer)
    if first.done and first.error is None:  # done: its result now (the task ends next turn)
        finished: asyncio.Future[T] = loop.create_future()
        finished.set_result(first.result)
        return finished
    return task


class _FirstStep:
    """How the first step of an eagerly started coroutine ended."""

    done = False
    result: Any = None
    error: BaseException | None = None
    yielded: Any = None


async def _carry_on(coro: Coroutine[Any, Any, T], first: _FirstStep) -> T:
    """Go on with ``coro`` after its first step, as a task steps a coroutine: wait for the
    future it yielded, then resume it; it reads that future's outcome itself. A cancellation
    of this task reaches ``coro`` through that future (cancelled with the task), or is thrown
    into it when the future was done already."""
    if first.done:
        if first.error is not None:
            raise first.error
        return first.result
    yielded = first.yielded
    del first
    while True:
        resume = coro.send
        argument: Any = None
        try:
            if yielded is None:  # a bare yield: `await asyncio.sleep(0)`
                await asyncio.sleep(0)
            else:
                yielded._asyncio_future_blocking = False  # as a task does with what it gets
                await yielded
        except asyncio.CancelledError as cancelled:
            if yielded is None or not yielded.cancelled():  # this task was cancelled
                resume, argument = coro.throw, cancelled
        except BaseException:  # noqa: S110 (coro reads the future's outcome when resumed)
            pass
        try:
            yielded = resume(argument)
        except StopIteration as stop:
            return stop.value


_EAGER_START = sys.version_info >= (3, 12)
_enter_task: Any = None
_leave_task: Any = None
if sys.version_info >= (3, 11) and not _EAGER_START:
    _enter_task = getattr(asyncio.tasks, "_enter_task", None)
    _leave_task = getattr(asyncio.tasks, "_leave_task", None)
    if _leave_task is None:
        _enter_task = None
