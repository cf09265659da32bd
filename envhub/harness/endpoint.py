"""The recording endpoint: an OpenAI-compatible server that agent programs call for the policy.

One server per process (127.0.0.1, a free port) serves every harness episode of the process;
each episode has its own unguessable key, which is both the path prefix of its ``base_url``
(``http://127.0.0.1:PORT/k/KEY/v1``) and its API key, so nothing one episode sends can reach
another's record. The server runs on its own event loop in a daemon thread, so the envs that use
it work from the sync API (``envhub check``) and from any runner's loop alike.

It serves ``POST /chat/completions`` and ``POST /responses`` (streamed or not) and
``GET /models``; both kinds of call are read as the same chat request
(:class:`~envhub.harness.wire.ChatRequest`), so the env does not know which API a harness speaks.

The endpoint does not generate: a call is handed to the episode's env as its next observation,
the rollout runner samples the turn with the run's engine (rendering, token-in/token-out, tool
parsing, recording, all as for any env), and the env's step hands the reply back here. Needs
Starlette and uvicorn (``pip install 'envhub[harness]'``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import logging
import secrets
import socket
import threading
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from envhub.errors import MissingDependencyError
from envhub.harness.mailbox import Mailbox, MailboxClosed, settle
from envhub.harness.responses import (
    ResponsesRequest,
    read_responses_request,
    response_body,
    response_events,
)
from envhub.harness.wire import (
    POLICY_MODEL,
    ChatRequest,
    Reply,
    WireError,
    completion_body,
    completion_events,
    error_body,
    read_chat_request,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R", bound=ChatRequest)

MAX_BODY_BYTES = 16 * 1024 * 1024
"""The largest request body read (a long agent history fits many times over)."""


@dataclass
class Call:
    """A request (chat completions or responses, read as chat) waiting for the policy's turn."""

    request: ChatRequest
    reply: asyncio.Future[Reply]
    id: str


@dataclass
class ProgramEnded:
    """The program returned (``failure`` is ``None``) or failed."""

    output: Any = None
    exit_code: int | None = None
    failure: str | None = None
    """``crash``, ``exit``, ``start``, ``timeout`` or ``request``; ``None`` when it returned."""
    message: str = ""


Event = Call | ProgramEnded


class Episode:
    """One episode's mailbox: its agent's calls and its program's end, delivered to the loop
    that runs the episode; the replies go back to the endpoint's loop (each hop is one wake-up,
    :mod:`envhub.harness.mailbox`)."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.events: Mailbox[Event] = Mailbox(orphaned=self._refuse_late)
        self.pending: Call | None = None
        self._why_closed = ""
        self._refused: deque[str] = deque()

    @property
    def closed(self) -> bool:
        """Whether the episode has ended (its calls are refused)."""
        return self.events.closed

    def refuse(self, why: str) -> None:
        """Record a request the endpoint refused (the program's fault; from any thread)."""
        self._refused.append(why)

    def take_refused(self) -> list[str]:
        """The requests refused since the last time this was asked."""
        taken = []
        while self._refused:
            taken.append(self._refused.popleft())
        return taken

    async def next_event(self) -> Event:
        """The next call or the program's end, whichever comes first (on the episode's loop).

        Raises:
            EpisodeClosed: The episode was closed meanwhile.
        """
        try:
            event = await self.events.get()
        except MailboxClosed:
            raise EpisodeClosed(self._why_closed or "the episode has ended") from None
        if isinstance(event, Call):
            self.pending = event
        return event

    def answer(self, reply: Reply | BaseException) -> None:
        """Hand the policy's turn (or an error) to the call waiting for it (from any thread)."""
        call, self.pending = self.pending, None
        if call is not None:
            settle(call.reply, reply)

    def close(self, why: str) -> None:
        """Refuse this episode's calls from now on; every waiting call gets ``why``."""
        self._why_closed = why
        self.answer(EpisodeClosed(why))
        for event in self.events.close():
            self._refuse_late(event, why)

    def _refuse_late(self, event: Event, why: str = "") -> None:
        if isinstance(event, Call):
            settle(event.reply, EpisodeClosed(why or self._why_closed))


class EpisodeClosed(Exception):
    """The episode a request belongs to has ended."""


class Endpoint:
    """The process's recording endpoint (see the module doc); get it with :meth:`shared`."""

    _shared: Endpoint | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        uvicorn, app = _server_parts()  # before any thread: a missing extra fails here, clearly
        self.loop = new_loop()
        self._episodes: dict[str, Episode] = {}
        self._ids = itertools.count()
        # IPPROTO_TCP named, so that asyncio sets TCP_NODELAY on each accepted connection:
        # uvicorn writes a reply's headers and body separately, and with Nagle's algorithm the
        # body waited for the client's delayed ACK (~40 ms a call; bench/harness_endpoint.py).
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(1024)
        self.port: int = self._sock.getsockname()[1]
        started = threading.Event()
        self._thread = threading.Thread(
            target=self._serve,
            args=(uvicorn, app(self._routes()), started),
            name="envhub-harness-endpoint",
            daemon=True,
        )
        self._thread.start()
        started.wait()
        # Programs run on a loop of their own: an agent that blocks its loop for a while
        # (building clients, parsing, its own tools) must not stall the server that answers
        # every episode (64 agents starting at once held off connections past the openai
        # client's 5 s connect timeout when they shared the server's loop).
        self.programs = new_loop()
        threading.Thread(
            target=self.programs.run_forever, name="envhub-harness-programs", daemon=True
        ).start()

    @classmethod
    def shared(cls) -> Endpoint:
        """The endpoint of this process, started on first use."""
        with cls._lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    def base_url(self, key: str) -> str:
        """The OpenAI ``base_url`` of the episode with this key."""
        return f"http://127.0.0.1:{self.port}/k/{key}/v1"

    def run(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the endpoint's loop (from any thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> Spawned:
        """Start ``coro`` on the programs' loop (from any thread)."""
        return Spawned(self.programs, coro)

    def post(self, episode: Episode, event: Event) -> None:
        """Hand ``event`` to ``episode``'s mailbox (from any thread)."""
        episode.events.put(event)

    def open(self) -> Episode:
        """A new episode with a fresh key (from any thread)."""
        episode = Episode(secrets.token_urlsafe(18))
        self._episodes[episode.key] = episode
        return episode

    def discard(self, episode: Episode, why: str) -> None:
        """Close ``episode`` and forget its key (from any thread)."""
        episode.close(why)
        self._episodes.pop(episode.key, None)

    # -- the server -----------------------------------------------------------------------------

    def _serve(self, uvicorn: Any, app: Any, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        # Only local programs call it: no proxy headers to trust, no Server/Date headers to add.
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_keep_alive=60,
            proxy_headers=False,
            server_header=False,
            date_header=False,
        )
        server = uvicorn.Server(config)
        server.install_signal_handlers = lambda: None  # a daemon thread's server: no signals
        self.loop.call_soon(started.set)
        self.loop.run_until_complete(server.serve(sockets=[self._sock]))

    def _routes(self) -> list[Any]:
        from starlette.routing import Route

        return [
            Route("/k/{key}/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/k/{key}/v1/responses", self._responses, methods=["POST"]),
            Route("/k/{key}/v1/models", self._models, methods=["GET"]),
        ]

    async def _models(self, request: Any) -> Any:
        from starlette.responses import JSONResponse

        if request.path_params["key"] not in self._episodes:
            return JSONResponse(error_body("unknown or ended episode", "not_found"), 404)
        model = {"id": POLICY_MODEL, "object": "model", "owned_by": "envhub"}
        return JSONResponse({"object": "list", "data": [model]})

    async def _chat(self, request: Any) -> Any:
        return await self._call(request, read_chat_request, "chatcmpl-", _chat_answer)

    async def _responses(self, request: Any) -> Any:
        return await self._call(request, read_responses_request, "resp_", _responses_answer)

    async def _call(
        self,
        request: Any,
        read: Callable[[Any], R],
        id_prefix: str,
        answer: Callable[[Reply, str, R], Any],
    ) -> Any:
        """Read a call with ``read``, hand it to its episode, and ``answer`` with the turn."""
        from starlette.responses import JSONResponse

        episode = self._episodes.get(request.path_params["key"])
        if episode is None or episode.closed:
            return JSONResponse(error_body("unknown or ended episode", "not_found"), 404)
        try:
            chat = read(await _json_body(request))
        except WireError as e:
            episode.refuse(str(e))
            return JSONResponse(error_body(str(e)), 400)
        call = Call(chat, self.loop.create_future(), f"{id_prefix}{next(self._ids)}")
        if not episode.events.put(call):
            return JSONResponse(error_body("unknown or ended episode", "not_found"), 404)
        try:
            reply = await call.reply
        except EpisodeClosed as e:
            return JSONResponse(error_body(f"the episode has ended: {e}", "episode_ended"), 409)
        except WireError as e:
            return JSONResponse(error_body(str(e)), 400)
        return answer(reply, call.id, chat)


def _chat_answer(reply: Reply, call_id: str, chat: ChatRequest) -> Any:
    from starlette.responses import JSONResponse, StreamingResponse

    if chat.stream:
        events = completion_events(reply, call_id, chat.model, chat.include_usage)
        return StreamingResponse(events, media_type="text/event-stream")
    return JSONResponse(completion_body(reply, call_id, chat.model))


def _responses_answer(reply: Reply, call_id: str, request: ResponsesRequest) -> Any:
    from starlette.responses import JSONResponse, StreamingResponse

    if request.stream:
        events = response_events(reply, call_id, request)
        return StreamingResponse(events, media_type="text/event-stream")
    return JSONResponse(response_body(reply, call_id, request))


class Spawned:
    """A coroutine running as a task on another thread's loop, stopped from any loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, None]) -> None:
        self._loop = loop
        self._task: asyncio.Task[None] | None = None
        self.ended: concurrent.futures.Future[None] = concurrent.futures.Future()
        loop.call_soon_threadsafe(self._start, coro)

    def done(self) -> bool:
        """Whether the task has ended."""
        return self.ended.done()

    async def cancel(self, within: float = 10.0) -> None:
        """Cancel the task and wait up to ``within`` s for it to end."""
        # Callbacks run in order: the task exists by the time this one runs.
        self._loop.call_soon_threadsafe(lambda: self._task is not None and self._task.cancel())
        await asyncio.wait({asyncio.wrap_future(self.ended)}, timeout=within)

    def _start(self, coro: Coroutine[Any, Any, None]) -> None:
        self._task = self._loop.create_task(coro)
        self._task.add_done_callback(lambda _: self.ended.set_result(None))


def new_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop where it is installed (it comes with uvicorn's standard set): the
    server's sockets and every cross-thread hop cost less on it; else asyncio's own."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _server_parts() -> tuple[Any, Callable[[list[Any]], Any]]:
    """uvicorn, and a Starlette app maker (the ``serve`` extra).

    Raises:
        MissingDependencyError: Either is not installed; the message says what to install.
    """
    try:
        import uvicorn
        from starlette.applications import Starlette
    except ImportError as e:
        raise MissingDependencyError(
            "harness envs need uvicorn and starlette: pip install 'envhub[harness]'"
        ) from e
    return uvicorn, lambda routes: Starlette(routes=routes)


async def _json_body(request: Any) -> Any:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise WireError(f"the body is over {MAX_BODY_BYTES} bytes")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise WireError(f"the body is over {MAX_BODY_BYTES} bytes")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise WireError(f"the body is not valid JSON ({type(e).__name__})") from None
