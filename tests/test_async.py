"""``within``: a timeout that never swallows its caller's cancellation; ``FirstInIteration``."""

from __future__ import annotations

import asyncio
import sys
import threading

import pytest

from envhub._async import FirstInIteration, close_thread_loop, run_sync, start_eagerly, within


def test_a_cancel_that_lands_as_the_step_finishes_is_not_lost() -> None:
    """The race behind an endless episode: the episode's timeout cancels the episode just as a
    step (itself under a timeout) finishes. ``asyncio.wait_for`` before 3.12 returns the step's
    result and drops the cancel; ``within`` must not."""
    seen: list[str] = []

    async def step(episode: asyncio.Task[None]) -> str:
        episode.cancel()  # the episode's deadline fires while this step completes
        return "step done"

    async def episode() -> None:
        seen.append(await within(60, step(asyncio.current_task())))  # type: ignore[arg-type]
        await asyncio.sleep(0)  # the cancel must land here at the latest
        seen.append("went on")

    async def main() -> None:
        with pytest.raises(asyncio.CancelledError):
            await asyncio.create_task(episode())

    asyncio.run(main())
    assert "went on" not in seen


def test_the_deadline_raises_a_bare_timeout_and_the_coroutines_own_pass_through() -> None:
    async def slow() -> None:
        await asyncio.sleep(10)

    async def own_timeout() -> None:
        raise TimeoutError("the socket timed out")

    async def main() -> tuple[str, str, int]:
        with pytest.raises(TimeoutError) as deadline:
            await within(0.01, slow())
        with pytest.raises(TimeoutError) as own:
            await within(5, own_timeout())
        return str(deadline.value), str(own.value), await within(5, asyncio.sleep(0, 7))

    assert asyncio.run(main()) == ("", "the socket timed out", 7)


def test_only_the_first_caller_of_a_loop_iteration_is_first() -> None:
    async def scenario() -> list[bool]:
        first = FirstInIteration()
        seen = [first.take(), first.take(), first.take()]
        await asyncio.sleep(0)  # the next iteration
        return [*seen, first.take(), first.take()]

    assert asyncio.run(scenario()) == [True, False, False, True, False]


EAGER = pytest.mark.skipif(
    sys.version_info < (3, 11), reason="3.10 starts an ordinary task (no asyncio.timeout either)"
)


@EAGER
def test_an_eager_task_runs_its_first_step_now_as_itself() -> None:
    seen: list[object] = []

    async def quick() -> str:
        seen.append(asyncio.current_task())
        return "done"

    async def main() -> None:
        outer = asyncio.current_task()
        answer = start_eagerly(quick())
        # It ran already, as a task of its own, and its result is there.
        assert answer.done() and answer.result() == "done"
        [task] = seen
        assert isinstance(task, asyncio.Task) and task is not outer
        assert asyncio.current_task() is outer
        assert await answer == "done"

    asyncio.run(main())


@EAGER
def test_an_eager_task_that_waits_goes_on_with_timeouts_and_cancels_of_its_own() -> None:
    async def waits(ready: asyncio.Future[int]) -> str:
        try:
            async with asyncio.timeout(0.05):  # the eager task's own timeout, not the caller's
                await asyncio.sleep(30)
        except TimeoutError:
            pass
        value = await ready
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return f"cancelled after {value}"
        return "never"

    async def fails() -> None:
        await asyncio.sleep(0)
        raise ValueError("no")

    async def main() -> None:
        ready = asyncio.get_running_loop().create_future()
        task = start_eagerly(waits(ready))
        await asyncio.sleep(0.2)  # the timeout inside fired without touching this task
        assert not task.done()
        ready.set_result(7)
        await asyncio.sleep(0.01)
        task.cancel()
        assert await task == "cancelled after 7"
        with pytest.raises(ValueError, match="no"):
            await start_eagerly(fails())

    asyncio.run(main())


def test_close_thread_loop_closes_the_loop_run_sync_keeps_for_its_thread():
    async def running_loop() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    loops: list[asyncio.AbstractEventLoop] = []

    def work() -> None:
        loops.extend([run_sync(running_loop()), run_sync(running_loop())])
        close_thread_loop()
        loops.append(run_sync(running_loop()))  # a fresh one after it
        close_thread_loop()

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert loops[0] is loops[1] and loops[2] is not loops[0]
    assert all(loop.is_closed() for loop in loops)
