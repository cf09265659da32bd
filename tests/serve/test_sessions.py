"""Sessions over time: retries of a slow step, slow envs side by side, TTL expiry, the session
limit, and a graceful shutdown that closes every env."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import pytest

import envhub
from envhub import registry
from envhub.env import Env
from envhub.errors import RemoteEnvUnavailableError
from envhub.serve.sessions import RequestSequence
from envhub.types import Message, user

CLOSED: list[int] = []


class Counter(Env):
    """Counts turns (sync, like most envs); each step sleeps ``delay`` seconds; 3 turns win."""

    name = "test-counter"

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__()
        self.delay, self.turns = delay, 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        gym.Env.reset(self, seed=seed)
        self.turns = 0
        return [user("count to three")], {}

    def step(self, action: Any) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        time.sleep(self.delay)
        self.turns += 1
        done = self.turns == 3
        return [user(str(self.turns))], float(done), done, False, {"turn": self.turns}

    def on_close(self) -> None:
        CLOSED.append(id(self))


@pytest.fixture(scope="module", autouse=True)
def counter_env() -> Iterator[None]:
    envhub.register(Counter.name, Counter, override=True)
    yield
    registry._registered.pop(Counter.name, None)


@pytest.fixture(scope="module")
def server(serve: Callable[..., Any]) -> Any:
    return serve(Counter.name)


@pytest.mark.parametrize("scheme", ["ws", "http"])
def test_a_step_retried_after_a_client_timeout_steps_once(server: Any, scheme: str) -> None:
    remote = envhub.make(server.url(scheme), delay=0.35, timeout=0.1, retries=30)
    remote.reset(seed=0)
    before = server.metrics()
    assert remote.step("one")[4] == {"turn": 1}
    assert remote.step("two")[4] == {"turn": 2}
    after = server.metrics()
    assert after["steps_total"] - before["steps_total"] == 2
    assert after["replays_total"] - before["replays_total"] >= 2  # the resends, answered once
    remote.close()


def test_a_slow_env_does_not_stall_the_others(server: Any) -> None:
    slow, fast = envhub.make(server.url(), delay=1.0), envhub.make(server.url("http"))

    async def race() -> float:
        await asyncio.gather(slow.areset(seed=0), fast.areset(seed=0))
        slow_step = asyncio.ensure_future(slow.astep("one"))
        started = time.perf_counter()
        for _ in range(3):
            await fast.astep("go")
        elapsed = time.perf_counter() - started
        assert not slow_step.done()
        await slow_step
        return elapsed

    assert asyncio.run(race()) < 0.5
    slow.close()
    fast.close()


def test_an_idle_session_expires_and_the_next_reset_opens_another(
    serve: Callable[..., Any],
) -> None:
    server = serve(Counter.name, session_ttl=0.3)
    remote = envhub.make(server.url())
    remote.reset(seed=0)
    remote.step("one")
    closed = len(CLOSED)
    server.wait_for("sessions_expired_total", 1)
    assert server.metrics()["sessions_open"] == 0 and len(CLOSED) == closed + 1
    with pytest.raises(RemoteEnvUnavailableError, match="lost mid-episode .*expired after 0.3 s"):
        remote.step("two")
    remote.reset(seed=0)  # between episodes: a new session
    assert remote.step("one")[4] == {"turn": 1}
    assert server.metrics()["sessions_created_total"] == 2
    remote.close()


def test_sessions_beyond_the_limit_are_refused_with_what_to_do(
    serve: Callable[..., Any],
) -> None:
    server = serve(Counter.name, max_sessions=2)
    first, second = envhub.make(server.url()), envhub.make(server.url("http"))
    with pytest.raises(RemoteEnvUnavailableError, match="maximum of 2 sessions.*--max-sessions"):
        envhub.make(server.url())
    first.close()
    third = envhub.make(server.url())
    assert third.reset(seed=0)[0] == [user("count to three")]
    second.close()
    third.close()


def test_a_graceful_shutdown_closes_every_session(serve: Callable[..., Any]) -> None:
    server = serve(Counter.name)
    remotes = [envhub.make(server.url(scheme)) for scheme in ("ws", "ws", "http")]
    for remote in remotes:
        remote.reset(seed=0)
        remote.step("one")
    closed = len(CLOSED)
    server.stop()
    assert len(CLOSED) == closed + 3
    with pytest.raises(RemoteEnvUnavailableError, match="lost mid-episode"):
        remotes[0].step("two")
    # HTTP has no connection to lose: its retries find no server, and the error says so
    with pytest.raises(RemoteEnvUnavailableError, match=r"no answer from http://.* after 3 tries"):
        remotes[2].step("two")


def test_a_request_sequence_tells_new_numbers_from_started_ones_in_bounded_memory() -> None:
    sequence = RequestSequence(window=8)
    assert [sequence.take(n) for n in (1, 2, 3, 2, 5, 4, 4)] == [
        True,
        True,
        True,
        False,
        True,
        True,
        False,
    ]
    assert sequence.take(100) and sequence.highest == 100
    assert [sequence.take(n) for n in (93, 92, 93, 5, 100, 101)] == [
        True,
        False,
        False,
        False,
        False,
        True,
    ]  # 92 is 8 below the highest (100) when asked: too old to tell, so refused
    assert sequence.take(2**62) and not sequence.take(2**62 - 8)
    assert sequence._seen.bit_length() <= 8  # a jump of any size keeps the window's size
