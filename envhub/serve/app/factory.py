"""The app: its routes and lifecycle around one :class:`~envhub.serve.service.EnvService`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from starlette.applications import Starlette
from starlette.routing import Route, WebSocketRoute

from envhub.serve.app.fairness import MAX_IN_FLIGHT, Floor
from envhub.serve.app.guards import Guard
from envhub.serve.app.post_route import PostHandler
from envhub.serve.app.status_routes import StatusRoutes
from envhub.serve.app.ws_route import WebSocketHandler
from envhub.serve.service import EnvService


class ServeApp:
    """Routes and lifecycle around one :class:`EnvService`.

    Args:
        service: What answers requests.
        env_names: Names the env may be addressed by in the URL path.
        token: The bearer token clients must send (``None``: no auth).
        sweep_every: Seconds between passes that close expired sessions and idle connections.
        threads: Worker threads for sync envs (the loop's default executor).
        idle_timeout: Seconds a WebSocket connection may stay idle (no frame from the client and
            no request running: an env step, however long, is not idle time) before the server
            closes it (1001).
        max_in_flight: Requests one WebSocket connection may have running at once.
    """

    def __init__(
        self,
        service: EnvService,
        env_names: set[str],
        token: str | None,
        sweep_every: float,
        threads: int,
        idle_timeout: float = 600.0,
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        self.service, self.env_names, self.token = service, env_names, token
        self.sweep_every, self.threads = sweep_every, threads
        self.idle_timeout, self.max_in_flight = idle_timeout, max_in_flight
        self.floor = Floor()
        guard = Guard(token, env_names)
        self.status = StatusRoutes(service, env_names)
        self.post = PostHandler(service, guard, self.floor)
        self.websockets = WebSocketHandler(service, guard, self.floor, max_in_flight)

    def starlette(self) -> Starlette:
        """The ASGI app."""
        return Starlette(
            routes=[
                Route("/healthz", self.status.healthz),
                Route("/metrics", self.status.metrics),
                Route("/{env:path}", self.post.handle, methods=["POST"]),
                WebSocketRoute("/{env:path}", self.websockets.handle),
            ],
            lifespan=self.lifespan,
        )

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        """Start the expiry sweeper; on shutdown, close every session."""
        executor = ThreadPoolExecutor(self.threads, thread_name_prefix="envhub-serve")
        asyncio.get_running_loop().set_default_executor(executor)
        sweeper = asyncio.ensure_future(self._sweep())
        try:
            yield
        finally:
            sweeper.cancel()
            await self.service.shutdown()

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_every)
            self._close_idle()
            await self.service.expire()

    def _close_idle(self) -> None:
        now = asyncio.get_running_loop().time()
        for connection in list(self.websockets.connections):
            if connection.idle_since(now) > self.idle_timeout:
                connection.hang_up(f"idle for more than {self.idle_timeout:g} s")
