"""Several vLLM engines serving one policy (``rollout.vllm.engines``): data parallelism for
rollouts.

:class:`ReplicatedTransport` is a :class:`~envhub.trainer.engines.vllm_transport.Transport` over
several servers. Generation goes to the engine with the fewest requests in flight (episodes are
independent, so any engine serves any request; the prefix cache of a multi-turn episode is the
price). Every control call goes to every engine at once and returns when all are done, so one
weight sync reaches them all:

- ``envhub_shm``: each bucket is written once to shared memory and every engine loads it before
  the trainer writes the next;
- NCCL: one group joins the trainer (rank 0) and every engine's workers; engine ``i`` gets the
  ranks after those of engines ``0..i-1`` (``rank_offset``).

Verification checks every engine (``VLLMEngine`` scores the fixed sequence on each replica).
"""

from __future__ import annotations

import asyncio
from typing import Any

from envhub.inference.base import SamplingParams
from envhub.trainer.engines.vllm_transport import Sampled, Transport


class ReplicatedTransport:
    """``replicas`` (started, stopped, synced together) behind one transport."""

    def __init__(self, replicas: list[Transport]) -> None:
        if not replicas:
            raise ValueError("ReplicatedTransport needs at least one replica")
        self.replicas = replicas
        self.in_flight = [0] * len(replicas)
        self.served = [0] * len(replicas)
        """Requests each engine answered (never reset: the engine's stats take differences)."""
        self._next = 0
        self._world_sizes: list[int] | None = None

    @property
    def trainer_address(self) -> str:
        return self.replicas[0].trainer_address

    @property
    def where(self) -> str:
        places = [r.where for r in self.replicas if r.where]
        return f"{len(self.replicas)} engines" + (f" ({'; '.join(places)})" if places else "")

    def requests_served(self) -> list[int]:
        return list(self.served)

    @property
    def urls(self) -> list[str]:
        """Each engine's base URL (for clients elsewhere, such as rollout workers)."""
        return [getattr(r, "url", None) or "" for r in self.replicas]

    async def start(self) -> None:
        await asyncio.gather(*(r.start() for r in self.replicas))

    async def close(self) -> None:
        await asyncio.gather(*(r.close() for r in self.replicas), return_exceptions=True)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Sampled:
        i = self._pick()
        self.in_flight[i] += 1
        try:
            out = await self.replicas[i].generate(prompt_ids, sampling)
        finally:
            self.in_flight[i] -= 1
        self.served[i] += 1
        return out

    def _pick(self) -> int:
        """The least busy engine; ties go round-robin, so an idle pool spreads a burst evenly."""
        n = len(self.replicas)
        order = [(self._next + k) % n for k in range(n)]
        choice = min(order, key=lambda i: self.in_flight[i])
        self._next = (choice + 1) % n
        return choice

    async def prompt_logprobs(self, ids: list[int]) -> list[float]:
        return await self.replicas[0].prompt_logprobs(ids)

    async def control(self, call: str, *args: Any) -> None:
        if call == "init_weight_transfer_engine" and "rank_offset" in (args[0] or {}):
            offsets = await self._rank_offsets(int(args[0]["rank_offset"]))
            await asyncio.gather(*(r.control(call, {**args[0], "rank_offset": o}) for r, o in zip(self.replicas, offsets, strict=True)))
            return
        await asyncio.gather(*(r.control(call, *args) for r in self.replicas))

    async def world_size(self) -> int:
        """All engines' workers together (the NCCL group has them all, after the trainer)."""
        return sum(await self._sizes())

    async def check_alive(self) -> None:
        await asyncio.gather(*(r.check_alive() for r in self.replicas))

    async def _sizes(self) -> list[int]:
        if self._world_sizes is None:
            self._world_sizes = list(await asyncio.gather(*(r.world_size() for r in self.replicas)))
        return self._world_sizes

    async def _rank_offsets(self, first: int) -> list[int]:
        return nccl_rank_offsets(first, await self._sizes())


def nccl_rank_offsets(first: int, world_sizes: list[int]) -> list[int]:
    """Each engine's first rank in one NCCL group whose engines' workers follow each other
    from rank ``first`` (the trainer's ranks come before)."""
    offsets, offset = [], first
    for size in world_sizes:
        offsets.append(offset)
        offset += size
    return offsets
