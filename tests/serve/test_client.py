"""The client transport's one-timer time-outs (``Deadlines``), on a real event loop."""

from __future__ import annotations

import asyncio

from envhub.serve.client import _TIMED_OUT, Deadlines


def test_each_watched_request_times_out_after_its_own_timeout_and_no_sooner() -> None:
    async def scenario() -> dict[str, float | str]:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines()
        short, long, answered = loop.create_future(), loop.create_future(), loop.create_future()
        start = loop.time()
        deadlines.watch(long, 0.6, loop)
        deadlines.watch(answered, 0.2, loop)
        deadlines.watch(short, 0.2, loop)  # shorter than the running tick: the timer re-arms
        answered.set_result("reply")
        deadlines.forget(answered)
        seen: dict[str, float | str] = {}
        await short
        seen["short"] = loop.time() - start
        await long
        seen["long"] = loop.time() - start
        seen["answered"] = answered.result()
        await asyncio.sleep(0.3)  # one more tick: nothing is watched, the timer stops
        seen["timer_after"] = "armed" if deadlines._timer is not None else "stopped"
        assert short.result() is _TIMED_OUT and long.result() is _TIMED_OUT
        return seen

    seen = asyncio.run(scenario())
    assert 0.2 <= seen["short"] < 0.2 + 0.3  # noticed within a tick (0.05 s), with slack
    assert 0.6 <= seen["long"] < 0.6 + 0.3
    assert seen["answered"] == "reply"
    assert seen["timer_after"] == "stopped"
