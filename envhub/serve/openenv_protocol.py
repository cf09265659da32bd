"""``envhub serve --protocol openenv``: an envhub env behind OpenEnv's wire protocol, so that
OpenEnv's own clients (``EnvClient``, ``GenericEnvClient``) drive it.

Routes, in the shapes of openenv-core 0.3's server:

- ``WS /ws`` — a session (an env) per connection. The client sends
  ``{"type": "reset", "data": {"seed": 0, ...}}``, ``{"type": "step", "data": ACTION}``,
  ``{"type": "state"}`` or ``{"type": "close"}``; the server answers
  ``{"type": "observation", "data": {"observation": OBS, "reward": r, "done": d}}``,
  ``{"type": "state", "data": {"episode_id": ..., "step_count": n}}`` or
  ``{"type": "error", "data": {"message": ..., "code": ...}}`` (OpenEnv's codes).
- ``POST /reset``, ``POST /step`` (``{"action": ACTION}``), ``GET /state`` — one episode shared
  by every HTTP caller. (OpenEnv's own HTTP handlers make a fresh env per call, which cannot
  carry a multi-turn episode; the sessions are on ``/ws``.)
- ``GET /health`` (``{"status": "healthy"}``), ``GET /schema``, ``GET /metadata``.

The mapping: ``ACTION`` is ``{"message": "<the assistant's text>"}`` (with optional OpenAI
``tool_calls``). ``OBS`` is ``{"text": ..., "messages": [...], "info": {...}, "truncated": b}``:
the env's new messages (OpenAI format), their contents joined by blank lines, and the step's
info as plain JSON (on reset also ``"tools"``, the env's tool schemas or ``null``); ``reward``
is the step's reward (``null`` on reset) and ``done`` is ``terminated or truncated``. In the
reset data, ``seed`` is the seed, ``episode_id`` is recorded in the state, and any other key is
a reset option (``{"task_index": 3}``).

OpenEnv's client sends no credentials, so this protocol serves without a token. Starlette and
uvicorn only (``envhub[serve]``); openenv-core is not needed to serve.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envhub.env import Env, close_quietly
from envhub.serve.sessions import EnvSession
from envhub.types import Message, ToolCall, assistant

logger = logging.getLogger(__name__)


class OpenEnvAction(BaseModel):
    """What a client sends as a step: the assistant's turn."""

    model_config = ConfigDict(extra="forbid")

    message: str = ""
    """The assistant's text."""
    tool_calls: list[dict[str, Any]] | None = None
    """Tool calls in the OpenAI format, for envs with tools."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """OpenEnv's per-action metadata (ignored)."""


class OpenEnvObservation(BaseModel):
    """What a reset or step answers (under ``data.observation``)."""

    text: str
    """The new messages' contents, joined by blank lines."""
    messages: list[dict[str, Any]]
    """The env's new messages (the prompt on reset), in the OpenAI format."""
    info: dict[str, Any] = Field(default_factory=dict)
    """The reset's or step's info, as plain JSON."""
    truncated: bool = False
    """The episode ran out of budget (``done`` is then true as well)."""
    tools: list[dict[str, Any]] | None = None
    """On reset: the OpenAI schemas of the env's tools, if it has any."""
    done: bool = False
    """OpenEnv's flag (sent beside the observation, not in it)."""
    reward: float | None = None
    """OpenEnv's reward (sent beside the observation, not in it)."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """OpenEnv's per-observation metadata (unused)."""


class OpenEnvState(BaseModel):
    """What ``state`` answers."""

    episode_id: str | None = None
    step_count: int = 0


class ProtocolError(Exception):
    """A request that cannot be served; ``code`` is one of OpenEnv's error codes."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(eq=False)
class OpenEnvSession(EnvSession):
    """A session of the OpenEnv protocol: an env and its episode's bookkeeping."""

    episode_id: str | None = None
    step_count: int = 0


class OpenEnvService:
    """Sessions of one env, and OpenEnv's messages turned into ``Env`` calls.

    Args:
        factory: Makes a session's env.
        max_sessions: WebSocket sessions open at once; more are refused (``CAPACITY_REACHED``).
    """

    def __init__(self, factory: Callable[[], Env], max_sessions: int) -> None:
        self.factory, self.max_sessions = factory, max_sessions
        self.sessions: set[OpenEnvSession] = set()
        self._reserved = 0

    async def open(self) -> OpenEnvSession:
        """A new session with a fresh env (made in a worker thread)."""
        if self._reserved >= self.max_sessions:
            raise ProtocolError(
                f"the server is full ({self.max_sessions} sessions; envhub serve --max-sessions)",
                "CAPACITY_REACHED",
            )
        self._reserved += 1
        try:
            env = await asyncio.to_thread(self.factory)
        except Exception as e:
            self._reserved -= 1
            raise ProtocolError(f"making the env failed: {e}", "FACTORY_ERROR") from e
        session = OpenEnvSession(env)
        self.sessions.add(session)
        return session

    async def close(self, session: OpenEnvSession) -> None:
        """Close the session's env (in a worker thread); safe to call twice."""
        if session in self.sessions:
            self.sessions.discard(session)
            self._reserved -= 1
            await asyncio.to_thread(close_quietly, session.env)

    async def reset(self, session: OpenEnvSession, data: dict[str, Any]) -> dict[str, Any]:
        """Reset the session's env from OpenEnv reset data; the observation payload."""
        options = dict(data)
        seed, episode_id = options.pop("seed", None), options.pop("episode_id", None)
        if seed is not None and not isinstance(seed, int):
            raise ProtocolError(f"seed must be an integer, got {seed!r}", "VALIDATION_ERROR")
        async with session.lock:
            observation, info = await session.env.areset(seed=seed, options=options or None)
            # Unique across servers and restarts, unlike RemoteEnv's per-process request ids.
            session.episode_id = str(episode_id) if episode_id is not None else uuid.uuid4().hex
            session.step_count = 0
        payload = _payload(observation, None, False, False, info)
        payload["observation"]["tools"] = session.env.tool_schemas
        return payload

    async def step(self, session: OpenEnvSession, data: dict[str, Any]) -> dict[str, Any]:
        """Step the session's env with an OpenEnv action; the observation payload."""
        try:
            action = OpenEnvAction.model_validate(data)
            calls = [ToolCall.model_validate(c) for c in action.tool_calls or ()]
        except ValidationError as e:
            message = f"invalid action: {e.errors()[0]['msg']}"
            raise ProtocolError(message, "VALIDATION_ERROR") from None
        turn = assistant(action.message, tool_calls=calls or None)
        async with session.lock:
            observation, reward, terminated, truncated, info = await session.env.astep(turn)
            session.step_count += 1
        return _payload(observation, float(reward), terminated, truncated, info)

    @staticmethod
    def state(session: OpenEnvSession) -> dict[str, Any]:
        """The session's OpenEnv state."""
        return OpenEnvState(
            episode_id=session.episode_id, step_count=session.step_count
        ).model_dump()

    async def shutdown(self) -> None:
        """Close every session."""
        await asyncio.gather(*(self.close(s) for s in list(self.sessions)))


class OpenEnvApp:
    """The Starlette routes of the OpenEnv protocol around one :class:`OpenEnvService`.

    Args:
        service: What answers.
        metadata: ``/metadata``'s answer (the env's name, description and version).
        threads: Worker threads for sync envs (the loop's default executor).
    """

    def __init__(self, service: OpenEnvService, metadata: dict[str, Any], threads: int) -> None:
        self.service, self.metadata, self.threads = service, metadata, threads
        self._http: OpenEnvSession | None = None
        self._http_lock = asyncio.Lock()

    def starlette(self) -> Any:
        """The ASGI app."""
        from starlette.applications import Starlette
        from starlette.routing import Route, WebSocketRoute

        return Starlette(
            routes=[
                Route("/health", self.health),
                Route("/schema", self.schema),
                Route("/metadata", self.describe),
                Route("/state", self.http_state),
                Route("/reset", self.http_reset, methods=["POST"]),
                Route("/step", self.http_step, methods=["POST"]),
                WebSocketRoute("/ws", self.websocket),
            ],
            lifespan=self.lifespan,
        )

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Any) -> AsyncIterator[None]:
        """Set the worker threads; on shutdown, close every session."""
        executor = ThreadPoolExecutor(self.threads, thread_name_prefix="envhub-openenv")
        asyncio.get_running_loop().set_default_executor(executor)
        try:
            yield
        finally:
            await self.service.shutdown()

    # -- plain endpoints ------------------------------------------------------------------------

    async def health(self, request: Any) -> Any:
        """Liveness, as OpenEnv's ``HealthResponse``."""
        return _json({"status": "healthy"})

    async def schema(self, request: Any) -> Any:
        """JSON schemas of the action, the observation and the state."""
        return _json(
            {
                "action": OpenEnvAction.model_json_schema(),
                "observation": OpenEnvObservation.model_json_schema(),
                "state": OpenEnvState.model_json_schema(),
            }
        )

    async def describe(self, request: Any) -> Any:
        """The env's name, description and version."""
        return _json(self.metadata)

    # -- HTTP: one shared episode ---------------------------------------------------------------

    async def http_reset(self, request: Any) -> Any:
        """Reset the shared HTTP env (made on first use) with the body's reset data."""
        body = await _body(request)
        async with self._http_lock:
            if self._http is None:
                return await self._http_answer(self._open_and_reset(body))
            return await self._http_answer(self.service.reset(self._http, body))

    async def _open_and_reset(self, body: dict[str, Any]) -> dict[str, Any]:
        self._http = await self.service.open()
        return await self.service.reset(self._http, body)

    async def http_step(self, request: Any) -> Any:
        """Step the shared HTTP env with the body's ``action``."""
        body = await _body(request)
        if self._http is None:
            return _json({"detail": "call /reset before /step"}, 409)
        if not isinstance(body.get("action"), dict):
            return _json({"detail": "the body needs an `action` object"}, 422)
        async with self._http_lock:
            return await self._http_answer(self.service.step(self._http, body["action"]))

    async def http_state(self, request: Any) -> Any:
        """The shared HTTP env's state."""
        if self._http is None:
            return _json(OpenEnvState().model_dump())
        return _json(self.service.state(self._http))

    async def _http_answer(self, call: Any) -> Any:
        try:
            return _json(await call)
        except ProtocolError as e:
            status = {"VALIDATION_ERROR": 422, "CAPACITY_REACHED": 503}.get(e.code, 500)
            return _json({"detail": str(e), "code": e.code}, status)
        except Exception as e:
            logger.warning("the env raised on an HTTP call", exc_info=e)
            return _json({"detail": f"{type(e).__name__}: {e}", "code": "EXECUTION_ERROR"}, 500)

    # -- WebSocket: a session per connection ----------------------------------------------------

    async def websocket(self, websocket: Any) -> None:
        """Open a session, answer the connection's messages in order, close it at the end."""
        from starlette.websockets import WebSocketDisconnect

        await websocket.accept()
        try:
            session = await self.service.open()
        except ProtocolError as e:
            await websocket.send_text(_error(str(e), e.code))
            await websocket.close()
            return
        try:
            while True:
                reply = await self._answer(session, await websocket.receive_text())
                if reply is None:
                    break
                await websocket.send_text(reply)
        except WebSocketDisconnect:
            pass
        finally:
            await self.service.close(session)
        with contextlib.suppress(RuntimeError):
            await websocket.close()

    async def _answer(self, session: OpenEnvSession, text: str) -> str | None:
        """The reply to one message (``None``: the client closes the session)."""
        try:
            message = json.loads(text)
            if not isinstance(message, dict):
                return _error("a message is a JSON object", "VALIDATION_ERROR")
            kind, data = message.get("type"), message.get("data") or {}
            if kind == "close":
                return None
            if kind == "state":
                return _dumps({"type": "state", "data": self.service.state(session)})
            if kind not in ("reset", "step"):
                return _error(f"Unknown message type: {kind}", "UNKNOWN_TYPE")
            if not isinstance(data, dict):
                return _error("`data` must be an object", "VALIDATION_ERROR")
            run = self.service.reset if kind == "reset" else self.service.step
            return _dumps({"type": "observation", "data": await run(session, data)})
        except json.JSONDecodeError as e:
            return _error(f"Invalid JSON: {e}", "INVALID_JSON")
        except ProtocolError as e:
            return _error(str(e), e.code)
        except Exception as e:  # the env raised: the client hears it, the session goes on
            logger.warning("the env raised", exc_info=e)
            return _error(f"{type(e).__name__}: {e}", "EXECUTION_ERROR")


def build_openenv_app(settings: Any) -> Any:
    """The ASGI app serving ``settings.env`` (a :class:`~envhub.serve.server.ServeSettings`)
    in the OpenEnv protocol. One env is made (and closed) first, so that a bad name or bad
    arguments fail now, with the loader's message.

    Raises:
        ConfigError: A token was set (OpenEnv's client cannot send one).
        MissingDependencyError: Starlette or uvicorn is not installed.
        EnvNotFoundError: No env by that name.
        EnvLoadError: The env rejects the arguments or cannot be made.
    """
    from envhub.errors import ConfigError
    from envhub.loader import make
    from envhub.serve.server import _require

    _require("starlette")
    if settings.token:
        raise ConfigError(
            "--protocol openenv serves without a token: OpenEnv's client sends no credentials "
            "(unset ENVHUB_SERVE_TOKEN, or serve with --protocol envhub)"
        )

    def factory() -> Env:
        return make(settings.env, **settings.env_args)

    probe = factory()
    metadata = {
        "name": probe.name,
        "description": (type(probe).__doc__ or probe.name).strip().split("\n")[0],
        "version": probe.version,
    }
    probe.close()
    service = OpenEnvService(factory, settings.max_sessions)
    return OpenEnvApp(service, metadata, settings.threads).starlette()


def serve_openenv(settings: Any, app: Any = None) -> None:
    """Serve ``settings.env`` in the OpenEnv protocol until interrupted (``app``: one that
    :func:`build_openenv_app` already made)."""
    from envhub.serve.server import run

    run(settings, app if app is not None else build_openenv_app(settings))


def _payload(
    observation: list[Message],
    reward: float | None,
    terminated: bool,
    truncated: bool,
    info: dict[str, Any],
) -> dict[str, Any]:
    messages = [m.to_openai() for m in observation]
    body = {
        "text": "\n\n".join(m.content or "" for m in observation),
        "messages": messages,
        "info": _plain(info),
        "truncated": bool(truncated),
    }
    return {"observation": body, "reward": reward, "done": bool(terminated or truncated)}


def _plain(value: Any) -> Any:
    """``value`` as plain JSON data (pydantic models dumped, tuples as lists, others as text)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return value.tolist()
    return str(value)


def _error(message: str, code: str) -> str:
    return _dumps({"type": "error", "data": {"message": message, "code": code}})


def _dumps(payload: Any) -> str:
    return json.dumps(payload, separators=(",", ":"))


def _json(payload: Any, status: int = 200) -> Any:
    from starlette.responses import Response

    return Response(_dumps(payload), status, media_type="application/json")


async def _body(request: Any) -> dict[str, Any]:
    raw = await request.body()
    try:
        body = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return {}
    return body if isinstance(body, dict) else {}
