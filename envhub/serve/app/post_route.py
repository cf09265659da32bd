"""``POST /ENV``: one request per HTTP call; the reply's status is its error code (200 if ok)."""

from __future__ import annotations

import asyncio
import math

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from envhub.serve.app.fairness import PACE, PACED_CHARS, PARSE_RATE, Floor
from envhub.serve.app.guards import Guard, json_response, read_bounded, too_large
from envhub.serve.service import Caller, EnvService


class PostHandler:
    """One request in the body, its reply in the response. Every HTTP client counts as one
    connection to the :class:`~envhub.serve.app.fairness.Floor`."""

    def __init__(self, service: EnvService, guard: Guard, floor: Floor) -> None:
        self.service, self.guard, self.floor = service, guard, floor
        self.caller = Caller(owner=None)
        self.spoke_at = -math.inf
        """When the last HTTP request came (HTTP clients contend for the loop as one)."""

    async def handle(self, request: Request) -> Response:
        """Answer the request in ``request``'s body."""
        refused = self.guard.refusal(
            request.headers.get("authorization"), request.path_params["env"]
        )
        if refused is not None:
            return json_response(self.service.refuse(refused), refused.code)
        limit = self.service.limits.max_message_bytes
        try:
            body = await read_bounded(request, limit)
        except ClientDisconnect:  # it went away (or was cut off half-sent): nobody to answer
            return Response(status_code=400)
        if body is None:
            return json_response(self.service.refuse(too_large(limit)), 413)
        now = asyncio.get_running_loop().time()
        self.floor.heard(self.caller, now, self.spoke_at)  # every HTTP client as one
        self.spoke_at = now
        reply = await self.service.handle(body, self.caller)
        if len(body) > PACED_CHARS and self.floor.contended(now):  # as a connection's frames
            await asyncio.sleep(PACE * len(body) / PARSE_RATE)
        return json_response(reply, 200 if reply["ok"] else reply["error"]["code"])
