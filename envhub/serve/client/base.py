"""What every transport of the client shares: the interface, the handshake header, the reply
size limit."""

from __future__ import annotations

from typing import Any

BATCH_HEADER = "envhub-batch"
"""Asks the server for batches; its answer is the largest batch frame it takes."""
MAX_REPLY_BYTES = 256 * 1024 * 1024
"""The largest reply a client reads (a reply carries what the env returned)."""


class Transport:
    """Carries frames to one server and their replies back."""

    url: str
    token: str | None
    users: int = 0
    """RemoteEnvs using it (a shared transport closes when the last one lets go)."""

    def alive(self, generation: int) -> bool:
        """Whether sessions opened in ``generation`` (of the connection) still exist."""
        return True

    async def request(
        self, frame: str, request_id: str, timeout: float | None, retries: int
    ) -> tuple[dict[str, Any], int]:
        """``(reply, generation)``: the reply to ``frame`` and the connection it came over."""
        raise NotImplementedError

    async def aclose(self) -> None:
        """Close the connection(s)."""
