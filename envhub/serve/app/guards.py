"""What a request passes before the service reads it: the bearer token, the env's name in the
URL path, the size limit; and the JSON response that replies and refusals go out as."""

from __future__ import annotations

import hmac

from starlette.requests import Request
from starlette.responses import Response

from envhub.serve import protocol as p


class Guard:
    """Who may call the server, and by which names the env may be addressed.

    Args:
        token: The bearer token clients must send (``None``: no auth).
        env_names: Names the env may be addressed by in the URL path.
    """

    def __init__(self, token: str | None, env_names: set[str]) -> None:
        self.token, self.env_names = token, env_names

    def refusal(self, authorization: str | None, env: str) -> p.RequestError | None:
        """Why a request with this ``Authorization`` header, for this env, is refused
        (``None``: it is not)."""
        if self.token is not None and not token_matches(authorization, self.token):
            return p.RequestError(
                401,
                p.UNAUTHORIZED,
                "missing or wrong bearer token; send `Authorization: Bearer TOKEN` (RemoteEnv: "
                "set ENVHUB_SERVE_TOKEN or pass token=)",
            )
        if env and env not in self.env_names:
            return p.RequestError(
                404, p.WRONG_ENV, f"this server serves {sorted(self.env_names)[0]!r}, not {env!r}"
            )
        return None


def token_matches(authorization: str | None, token: str) -> bool:
    """Whether ``authorization`` is ``Bearer TOKEN`` with this ``token``."""
    scheme, _, given = (authorization or "").partition(" ")
    # Constant time, so the reply's timing does not tell how much of a guess was right.
    return scheme.lower() == "bearer" and hmac.compare_digest(given.encode(), token.encode())


def larger(frame: str | bytes, limit: int) -> bool:
    """Whether ``frame`` is larger than ``limit`` bytes (a short text is not encoded to tell)."""
    if isinstance(frame, bytes) or len(frame) > limit:  # (a character takes a byte or more)
        return len(frame) > limit
    return len(frame) > limit // 4 and len(frame.encode()) > limit


def too_large(limit: int) -> p.RequestError:
    """The refusal of a frame or body over ``limit`` bytes."""
    return p.RequestError(
        413,
        p.TOO_LARGE,
        f"the frame is larger than this server's limit of {limit} bytes "
        "(envhub serve --max-message-bytes)",
    )


async def read_bounded(request: Request, limit: int) -> bytes | None:
    """The body, or ``None`` as soon as it is larger than ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def json_response(payload: dict, status: int) -> Response:
    """``payload`` as a JSON response with this status."""
    # JSONResponse refuses inf/nan, which rewards and reward ranges may hold.
    return Response(p.dumps(payload), status, media_type="application/json")
