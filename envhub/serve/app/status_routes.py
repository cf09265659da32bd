"""``GET /healthz`` and ``GET /metrics``: they carry no env data and need no token."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from envhub.serve.service import EnvService


class StatusRoutes:
    """Liveness and counters of one :class:`~envhub.serve.service.EnvService`."""

    def __init__(self, service: EnvService, env_names: set[str]) -> None:
        self.service, self.env_names = service, env_names

    async def healthz(self, request: Request) -> Response:
        """Liveness: the server runs and which env it serves."""
        return JSONResponse({"status": "ok", "env": sorted(self.env_names)[0]})

    async def metrics(self, request: Request) -> Response:
        """Counters and gauges in the Prometheus text format."""
        m = self.service.metrics
        values = {
            "sessions_open": len(self.service.store),
            "connections_open": m.connections_open,
            "sessions_created_total": m.sessions_created,
            "sessions_expired_total": m.sessions_expired,
            "requests_total": m.requests,
            "errors_total": m.errors,
            "steps_total": m.steps,
            "resets_total": m.resets,
            "replays_total": m.replays,
        }
        lines = [f"envhub_serve_{name} {value}" for name, value in values.items()]
        return PlainTextResponse("\n".join(lines) + "\n")
