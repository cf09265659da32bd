"""The cross-loop mailbox: order, delivery from another thread, closing, and the races of a
cancelled wait (an item on its way is kept, or handed to ``orphaned`` once closed)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from envhub.harness.mailbox import Mailbox, MailboxClosed, settle


@pytest.fixture
def other_loop():
    """An event loop running in a thread of its own (the endpoint's, in the real thing)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)
    loop.close()


def test_items_put_before_a_get_come_out_in_order():
    box: Mailbox[int] = Mailbox()
    assert box.put(1) and box.put(2)

    async def take_two() -> list[int]:
        return [await box.get(), await box.get()]

    assert asyncio.run(take_two()) == [1, 2]


def test_an_item_put_from_another_loop_wakes_the_waiting_get(other_loop):
    box: Mailbox[str] = Mailbox()

    async def wait_then_put() -> str:
        getting = asyncio.ensure_future(box.get())
        await asyncio.sleep(0)  # the get is waiting now
        other_loop.call_soon_threadsafe(box.put, "call")
        return await asyncio.wait_for(getting, 30)

    assert asyncio.run(wait_then_put()) == "call"


def test_closing_hands_back_what_was_never_taken_and_refuses_later_puts():
    box: Mailbox[int] = Mailbox()
    box.put(1)
    box.put(2)
    assert box.close() == [1, 2]
    assert box.closed
    assert box.put(3) is False
    with pytest.raises(MailboxClosed):
        asyncio.run(box.get())


def test_closing_wakes_a_waiting_get_with_mailbox_closed():
    box: Mailbox[int] = Mailbox()

    async def wait_then_close() -> None:
        getting = asyncio.ensure_future(box.get())
        await asyncio.sleep(0)
        assert box.close() == []
        await asyncio.wait_for(getting, 30)

    with pytest.raises(MailboxClosed):
        asyncio.run(wait_then_close())


def test_an_item_on_its_way_to_a_cancelled_get_goes_to_the_next_get():
    box: Mailbox[str] = Mailbox()

    async def race() -> str:
        getting = asyncio.ensure_future(box.get())
        await asyncio.sleep(0)
        box.put("first")  # its delivery is queued on this loop ...
        getting.cancel()  # ... and the wait is cancelled before it lands
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        box.put("second")
        return await box.get()

    assert asyncio.run(race()) == "first"


def test_an_item_on_its_way_when_the_mailbox_closes_goes_to_orphaned():
    orphans: list[str] = []
    box: Mailbox[str] = Mailbox(orphaned=orphans.append)

    async def race() -> list[str]:
        getting = asyncio.ensure_future(box.get())
        await asyncio.sleep(0)
        box.put("late")
        getting.cancel()
        left = box.close()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return left

    assert asyncio.run(race()) == []
    assert orphans == ["late"]


def test_settle_resolves_a_future_of_another_loop_once(other_loop):
    async def make() -> asyncio.Future[int]:
        return other_loop.create_future()

    future = asyncio.run_coroutine_threadsafe(make(), other_loop).result(timeout=30)
    settle(future, 7)
    settle(future, 8)  # already done: left as it is
    error_future = asyncio.run_coroutine_threadsafe(make(), other_loop).result(timeout=30)
    settle(error_future, ValueError("no"))

    async def results() -> tuple[int, BaseException | None]:
        return future.result(), error_future.exception()

    value, error = asyncio.run_coroutine_threadsafe(results(), other_loop).result(timeout=30)
    assert value == 7
    assert isinstance(error, ValueError) and str(error) == "no"
