"""The client vLLM's trainer-side engines call: every engine at once, from a blocking thread.

vLLM's trainer engines make blocking calls (``init_weight_transfer_engine``,
``start_weight_update``, ``update_weights``, ``finish_weight_update``: its
``VLLMWeightSyncClient``). They run in a worker thread, because NCCL must send while the engine
receives and because the driver's in-process engine lives on the driver's event loop.
:class:`FanoutClient` hands each call to an event loop, where it goes to every engine
(:class:`~.plan.WeightReceiver`) concurrently, and returns when all have answered: one sync
reaches every engine. The driver passes its own loop and its transport's replicas; a trainer
rank passes a :class:`LoopThread` of its own and a :class:`~.routes.VLLMRoutes` per server.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

from envhub.trainer.weight_sync.plan import Transfer, WeightReceiver

T = TypeVar("T")


class FanoutClient:
    """vLLM's ``VLLMWeightSyncClient`` over ``receivers``, run on ``loop``.

    Args:
        loop: The event loop the receivers belong to (not the calling thread's).
        receivers: Every engine of the policy.
        transfer: The transfer in use: it says which init info each engine gets (NCCL gives
            each engine its own ranks in the one group).
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        receivers: Sequence[WeightReceiver],
        transfer: Transfer,
    ) -> None:
        self._loop = loop
        self._receivers = list(receivers)
        self._transfer = transfer
        self._world_sizes: list[int] | None = None

    def world_sizes(self) -> list[int]:
        """Each engine's workers (asked once)."""
        if self._world_sizes is None:
            self._world_sizes = self._each(lambda _, r: r.world_size())
        return self._world_sizes

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        """Every engine joins the transfer, with its own init info where the transfer says so."""
        infos = self._transfer.engine_init_infos(init_info, self.world_sizes) or [init_info] * len(
            self._receivers
        )
        self._each(lambda k, r: r.init_weight_transfer_engine(infos[k]))

    def start_weight_update(self) -> None:
        """Every engine begins receiving a sync."""
        self._each(lambda _, r: r.start_weight_update())

    def update_weights(self, update_info: Any) -> None:
        """Every engine receives one bucket."""
        self._each(lambda _, r: r.update_weights(update_info))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        """Every engine finishes the sync."""
        self._each(lambda _, r: r.finish_weight_update(weight_version))

    def _each(self, call: Callable[[int, WeightReceiver], Awaitable[T]]) -> list[T]:
        """``call(k, engine k)`` for every engine at once, on the loop; their results in order."""

        async def gather() -> list[T]:
            return list(await asyncio.gather(*(call(k, r) for k, r in enumerate(self._receivers))))

        return asyncio.run_coroutine_threadsafe(gather(), self._loop).result()


class LoopThread:
    """An event loop running in a daemon thread of its own, for a caller that has none."""

    def __init__(self, name: str = "envhub-weight-sync") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def close(self) -> None:
        """Stop the loop and its thread; idempotent."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()
