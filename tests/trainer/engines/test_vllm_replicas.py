"""``ReplicatedTransport``'s own logic: which engine serves a request, and how one weight sync
reaches every engine. The replicas here are small recording transports; real vLLM engines behind
it run in ``tests/e2e/test_train_megatron.py`` (two engines on Ray, every sync verified on both)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from envhub.inference.base import SamplingParams
from envhub.trainer.engines.vllm_replicas import ReplicatedTransport
from envhub.trainer.engines.vllm_transport import Sampled


class Recording:
    """A transport that answers (once ``gate`` is open, if it has one) and records what it was asked."""

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

    async def control(self, call: str, *args: Any) -> None:
        self.calls.append((call, args))

    async def world_size(self) -> int:
        return self.size


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
        first = [asyncio.create_task(transport.generate([1], SamplingParams())) for _ in range(2)]  # one each
        await asyncio.wait(first, timeout=0)  # let both start: f answers, s waits for its gate
        await asyncio.sleep(0)
        busy = list(transport.in_flight)
        # s is still busy; a request routed to it anyway would wait for the gate and time out
        later = [await asyncio.wait_for(transport.generate([1], SamplingParams()), 5) for _ in range(3)]
        gate.set()
        return [*(await asyncio.gather(*first)), *later], busy + transport.served + transport.in_flight

    outs, counts = asyncio.run(burst())
    assert _names(outs) == "sffff"
    assert counts == [1, 0, 1, 4, 0, 0]  # in flight mid-burst, then served, then in flight at the end


def test_one_sync_reaches_every_engine_with_its_own_nccl_ranks() -> None:
    a, b = Recording("a", world_size=2), Recording("b", world_size=3)
    transport = ReplicatedTransport([a, b])
    assert asyncio.run(transport.world_size()) == 5  # the trainer's group: 1 + 5 ranks
    init = {"master_address": "10.0.0.1", "master_port": 29500, "rank_offset": 1, "world_size": 6}
    asyncio.run(transport.control("init_weight_transfer_engine", init))
    assert a.calls == [("init_weight_transfer_engine", ({**init, "rank_offset": 1},))]
    assert b.calls == [("init_weight_transfer_engine", ({**init, "rank_offset": 3},))]  # after a's two workers
    asyncio.run(transport.control("update_weights", {"names": ["w"]}))
    assert a.calls[-1] == b.calls[-1] == ("update_weights", ({"names": ["w"]},))
    shm = {"path": "/dev/shm/x"}  # no ranks: the same info for every engine
    asyncio.run(transport.control("init_weight_transfer_engine", shm))
    assert a.calls[-1] == b.calls[-1] == ("init_weight_transfer_engine", (shm,))


def test_the_trainer_address_and_urls_come_from_the_engines() -> None:
    transport = ReplicatedTransport([Recording("a"), Recording("b")])
    assert transport.trainer_address == "10.0.0.1"
    assert transport.where == "2 engines"
    with pytest.raises(ValueError, match="at least one replica"):
        ReplicatedTransport([])
