"""Several vLLM engines serving one policy (``rollout.vllm.engines``): data parallelism for
rollouts.

:class:`ReplicatedTransport` is a :class:`~envhub.trainer.engines.vllm_transport.Transport` over
several servers. Generation goes to the engine with the fewest requests in flight (episodes are
independent, so any engine serves any request; the prefix cache of a multi-turn episode is the
price). Starting, stopping, sleeping, waking and resetting the prefix cache go to every engine at
once. A weight sync reaches every engine through its ``replicas`` (``weight_sync`` fans each call
out: one shared-memory write, or one NCCL group with each engine's ranks after the previous
one's), and verification checks every engine.
"""

from __future__ import annotations

import asyncio

from envhub.inference.base import SamplingParams
from envhub.trainer.engines.vllm_transport import EngineTransport, Sampled


class ReplicatedTransport:
    """``replicas`` (started, stopped, synced together) behind one transport."""

    def __init__(self, replicas: list[EngineTransport]) -> None:
        if not replicas:
            raise ValueError("ReplicatedTransport needs at least one replica")
        self.replicas = replicas
        self.in_flight = [0] * len(replicas)
        self.served = [0] * len(replicas)
        """Requests each engine answered (never reset: the engine's stats take differences)."""
        self._next = 0

    @property
    def trainer_address(self) -> str:
        """The first engine's view of the trainer (they share a trainer)."""
        return self.replicas[0].trainer_address

    @property
    def where(self) -> str:
        """How many engines, and where those that say so run."""
        places = [r.where for r in self.replicas if r.where]
        return f"{len(self.replicas)} engines" + (f" ({'; '.join(places)})" if places else "")

    def requests_served(self) -> list[int]:
        """Requests each engine has answered since the start."""
        return list(self.served)

    async def start(self) -> None:
        """Start every engine at once."""
        await asyncio.gather(*(r.start() for r in self.replicas))

    async def aclose(self) -> None:
        """Stop every engine (one failing to stop does not keep the others running)."""
        await asyncio.gather(*(r.aclose() for r in self.replicas), return_exceptions=True)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Sampled:
        """Sample on the least busy engine."""
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
        """The first engine's (verification asks each replica itself)."""
        return await self.replicas[0].prompt_logprobs(ids)

    async def reset_prefix_cache(self, running: bool = False) -> None:
        """Every engine drops its cached KV."""
        await asyncio.gather(*(r.reset_prefix_cache(running) for r in self.replicas))

    async def pause_generation(self) -> None:
        """Every engine freezes its requests in flight."""
        await asyncio.gather(*(r.pause_generation() for r in self.replicas))

    async def resume_generation(self) -> None:
        """Every engine goes on."""
        await asyncio.gather(*(r.resume_generation() for r in self.replicas))

    async def sleep(self) -> None:
        """Every engine sleeps."""
        await asyncio.gather(*(r.sleep() for r in self.replicas))

    async def wake_up(self, tags: str | None = None) -> None:
        """Every engine wakes."""
        await asyncio.gather(*(r.wake_up(tags) for r in self.replicas))

    async def check_alive(self) -> None:
        """Raise if any engine is gone."""
        await asyncio.gather(*(r.check_alive() for r in self.replicas))
