"""The client's errors: error replies, refused handshakes and lost connections as
:mod:`envhub.errors`' exceptions."""

from __future__ import annotations

import json
from typing import Any

from envhub.errors import RemoteEnvError, RemoteEnvUnavailableError
from envhub.serve import protocol as p


class ConnectionLost(RemoteEnvUnavailableError):
    """The connection a request went over dropped (the request may be sent again)."""


def raise_for_error(error: dict[str, Any], url: str, op: str) -> None:
    """Raise the client's exception for an error reply.

    Raises:
        RemoteEnvUnavailableError: The session is gone, or the server is full or stopping.
        RemoteEnvError: Anything else: the env raised (its class in ``remote_type``), a bad
            token, a request the server refused.
    """
    info = p.ErrorInfo.model_validate(error)
    if info.type in (p.UNKNOWN_SESSION, p.CAPACITY, p.SHUTTING_DOWN):
        raise RemoteEnvUnavailableError(f"{url}: {info.message}", remote_type=info.type)
    if info.code == 500:
        raise RemoteEnvError(
            f"the env at {url} raised {info.type} in {op}: {info.message}", remote_type=info.type
        )
    if info.type == p.UNAUTHORIZED:
        raise RemoteEnvError(f"{url} refused the token: {info.message}", remote_type=info.type)
    raise RemoteEnvError(
        f"{url} refused the {op} request ({info.code} {info.type}): {info.message}",
        remote_type=info.type,
    )


def refused(url: str, status: int, body: bytes | None) -> RemoteEnvError:
    """The error for a reply that is not a protocol reply (a denied WebSocket handshake)."""
    try:
        error = json.loads(body or b"")["error"]
        raise_for_error(error, url, "connect")
    except RemoteEnvError as e:
        return e
    except (ValueError, KeyError, TypeError):
        pass
    text = (body or b"")[:200].decode("utf-8", "replace")
    kind = RemoteEnvUnavailableError if status >= 500 else RemoteEnvError
    return kind(f"{url} answered HTTP {status}, not as an envhub server: {text!r}")
