"""Whose fault an OpenEnv ``VALIDATION_ERROR`` is: the action's, or the env's own ``step``.

OpenEnv's server answers any pydantic ``ValidationError`` raised while stepping with the same
code, whether the action failed to validate (the policy's failed turn) or the env's own code
built an invalid model (a bug in the env: an episode that failed, not a turn the policy lost).
Its client keeps only the message; :func:`client_class` keeps the error list too, and
:func:`blames_action` reads it: every error must point into the action that was sent, at the
very value that was sent.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

_MISSING = object()


class ServerError(RuntimeError):
    """An error answer of OpenEnv's server, with its code and (for validation) its errors.

    The message is the one OpenEnv's own client raises, so code reading it keeps working.
    """

    def __init__(self, data: dict[str, Any]) -> None:
        self.code = str(data.get("code", "UNKNOWN"))
        self.errors: list[dict[str, Any]] | None = data.get("errors")
        message = data.get("message", "Unknown error")
        super().__init__(f"Server error: {message} (code: {self.code})")


@functools.cache
def client_class() -> type:
    """OpenEnv's ``GenericEnvClient``, raising :class:`ServerError` for an error answer."""
    from openenv.core import GenericEnvClient

    class Client(GenericEnvClient):  # type: ignore[misc, valid-type]
        async def _send_and_receive(self, message: dict[str, Any]) -> dict[str, Any]:
            await self._send(message)
            response = await self._receive()
            if response.get("type") == "error":
                raise ServerError(response.get("data", {}))
            return response

    return Client


def _at(value: Any, path: Sequence[Any]) -> Any:
    """``value`` at ``path`` (keys and list indices), or ``_MISSING``."""
    for key in path:
        if isinstance(value, dict) and key in value:
            value = value[key]
        elif isinstance(value, list) and isinstance(key, int) and -len(value) <= key < len(value):
            value = value[key]
        else:
            return _MISSING
    return value


def blames_action(errors: list[dict[str, Any]] | None, action: dict[str, Any]) -> bool:
    """Whether validation ``errors`` are all about ``action`` as sent: each error's location is
    in the action and its input is the action's value there (for a missing field: the object
    that lacks it). No error list (an older server) blames the action, as OpenEnv does."""
    if not errors:
        return True
    for error in errors:
        loc = list(error.get("loc", ()))
        if error.get("type") == "missing":
            loc = loc[:-1]
        found = _at(action, loc)
        if found is _MISSING or found != error.get("input", _MISSING):
            return False
    return True
