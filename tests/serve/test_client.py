"""The client transport's one-timer time-outs (``Deadlines``), on a real event loop, and the
HTTP transport's proxy, read from the environment once."""

from __future__ import annotations

import asyncio

import pytest

from envhub.serve.client import _TIMED_OUT, Deadlines, _env_proxy


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


def test_the_http_transport_takes_its_proxy_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert _env_proxy("http://envs.example:8000/calculator") is None
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.corp:3128")
    monkeypatch.setenv("HTTPS_PROXY", "http://tls-proxy.corp:3128")
    monkeypatch.setenv("NO_PROXY", "localhost,.internal")
    assert _env_proxy("http://envs.example:8000/calculator") == "http://proxy.corp:3128"
    assert _env_proxy("https://envs.example/calculator") == "http://tls-proxy.corp:3128"
    assert _env_proxy("http://localhost:8000/calculator") is None
    assert _env_proxy("http://gpu7.internal:8000/calculator") is None
