"""The service's futures: every long call answers at once with a request id, and the client
polls ``/api/v1/retrieve_future`` for the result (Tinker's asynchronous protocol).

A retrieve waits up to ``wait_s`` for the result (a long poll) and otherwise answers
``{"type": "try_again"}``, which the SDK retries at once. A result is kept until the store
holds more than ``keep`` finished ones (the SDK may retrieve one again after a lost reply).
A failure is ``{"error": ..., "category": "user" | "server"}``, the SDK's
``RequestFailedResponse``: ``user`` for a request the service refuses (an envhub
``ConfigError``), ``server`` for anything else.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import OrderedDict
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from envhub.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    """A finished request: a JSON document, or protobuf bytes (``proto``)."""

    body: dict[str, Any] | bytes
    proto: bool = False


TRY_AGAIN = {"type": "try_again", "queue_state": "active"}


class Futures:
    """Pending and finished requests by id."""

    def __init__(self, keep: int = 4096) -> None:
        self.keep = keep
        self._ids = itertools.count(1)
        self._tasks: OrderedDict[str, asyncio.Future[Outcome]] = OrderedDict()

    def submit(self, work: Awaitable[Outcome]) -> str:
        """Start ``work`` (on the running loop); return its request id."""
        request_id = f"req-{next(self._ids)}"
        self._tasks[request_id] = asyncio.ensure_future(_failures_as_outcomes(work))
        self._forget_old()
        return request_id

    async def retrieve(self, request_id: str, wait_s: float) -> Outcome | None:
        """The outcome of ``request_id``, waiting up to ``wait_s``; ``None`` if not done yet.

        Raises:
            KeyError: No such request (never made, or forgotten).
        """
        task = self._tasks[request_id]
        done, _ = await asyncio.wait({task}, timeout=wait_s)
        return task.result() if done else None

    def cancel_all(self) -> None:
        """Cancel what is still running (the service is stopping)."""
        for task in self._tasks.values():
            task.cancel()

    def _forget_old(self) -> None:
        finished = [k for k, t in self._tasks.items() if t.done()]
        for key in finished[: max(0, len(finished) - self.keep)]:
            del self._tasks[key]


async def _failures_as_outcomes(work: Awaitable[Outcome]) -> Outcome:
    try:
        return await work
    except ConfigError as e:
        return Outcome({"error": str(e), "category": "user"})
    except Exception as e:  # a server fault: logged here, the client gets its message
        log.exception("a service request failed")
        return Outcome({"error": f"{type(e).__name__}: {e}", "category": "server"})
