"""``ReplicatedTransport``'s own logic: which engine serves a request, and what every engine gets
at once. The replicas here are small recording transports; how one weight sync reaches every
engine is tested in ``tests/trainer/weight_sync/test_clients.py``; real vLLM engines behind it
run in ``tests/e2e/test_train_megatron.py`` (two engines on Ray, every sync verified on both)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from envhub.inference.base import SamplingParams
from envhub.trainer.engines.vllm_replicas import ReplicatedTransport
from envhub.trainer.engines.vllm_transport import Sampled


class Recording:
    """A transport that records what it was asked and answers with its name's character.

    With a ``gate``, it answers only once the gate is open.
    """

    trainer_address = "10.0.0.1"
    where = ""

    def __init__(self, name: str, world_size: int = 1, gate: asyncio.Event | None = None) -> None:
        self.name, self.size, self.gate = name, world_size, gate
        self.calls: list[tuple[str, tuple]] = []

    @property
    def replicas(self) -> list[Any]:
        return [self]

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Sampled:
        if self.gate is not None:
            await self.gate.wait()
        return Sampled([ord(self.name)], [0.0], "stop")

    async def reset_prefix_cache(self, running: bool = False) -> None:
        self.calls.append(("reset_prefix_cache", (running,)))

    async def wake_up(self, tags: str | None = None) -> None:
        self.calls.append(("wake_up", (tags,)))

    async def pause_generation(self) -> None:
        self.calls.append(("pause_generation", ()))

    async def resume_generation(self) -> None:
        self.calls.append(("resume_generation", ()))


def _names(outs: list[Sampled]) -> str:
    return "".join(chr(o.token_ids[0]) for o in outs)


def test_requests_go_round_robin_when_engines_are_idle() -> None:
    transport = ReplicatedTransport([Recording("a"), Recording("b"), Recording("c")])

    async def one_by_one() -> list[Sampled]:
        return [await transport.generate([1], SamplingParams()) for _ in range(5)]

    assert _names(asyncio.run(one_by_one())) == "abcab"
    assert transport.served == [2, 2, 1]


def test_a_burst_goes_to_the_least_busy_engine() -> None:
    async def burst() -> tuple[list[Sampled], list[int]]:
        gate = asyncio.Event()
        transport = ReplicatedTransport([Recording("s", gate=gate), Recording("f")])
        first = [
            asyncio.create_task(transport.generate([1], SamplingParams())) for _ in range(2)
        ]  # one each
        await asyncio.wait(first, timeout=0)  # let both start: f answers, s waits for its gate
        await asyncio.sleep(0)
        busy = list(transport.in_flight)
        # s is still busy; a request routed to it anyway would wait for the gate and time out
        later = [
            await asyncio.wait_for(transport.generate([1], SamplingParams()), 5) for _ in range(3)
        ]
        gate.set()
        return [
            *(await asyncio.gather(*first)),
            *later,
        ], busy + transport.served + transport.in_flight

    outs, counts = asyncio.run(burst())
    assert _names(outs) == "sffff"
    assert counts == [
        1,
        0,
        1,
        4,
        0,
        0,
    ]  # in flight mid-burst, then served, then in flight at the end


def test_the_trainer_address_and_urls_come_from_the_engines() -> None:
    transport = ReplicatedTransport([Recording("a"), Recording("b")])
    assert transport.trainer_address == "10.0.0.1"
    assert transport.where == "2 engines"
    with pytest.raises(ValueError, match="at least one replica"):
        ReplicatedTransport([])


def test_pausing_waking_and_resetting_the_cache_reach_every_engine() -> None:
    a, b = Recording("a"), Recording("b")
    transport = ReplicatedTransport([a, b])
    asyncio.run(transport.pause_generation())
    asyncio.run(transport.wake_up("weights"))
    asyncio.run(transport.reset_prefix_cache(running=True))
    asyncio.run(transport.resume_generation())
    expected = [
        ("pause_generation", ()),
        ("wake_up", ("weights",)),
        ("reset_prefix_cache", (True,)),
        ("resume_generation", ()),
    ]
    assert a.calls == b.calls == expected
