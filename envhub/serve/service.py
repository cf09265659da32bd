"""The env service: requests in, ``Env`` calls, replies out. No transport here.

The app (:mod:`envhub.serve.app`) hands every frame to :meth:`EnvService.handle` and sends back
what it returns; this module never raises into it. Env calls go through ``areset``/``astep``:
natively async envs run on the server's loop, sync ones in a worker thread (the ``Env`` default),
so a slow env never stalls the others. Making and closing envs also run in worker threads.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from envhub.env import Env, TaskEnv
from envhub.serve import protocol as p
from envhub.serve.sessions import AnswerCache, Session, SessionStore, close_env

logger = logging.getLogger(__name__)

Answer = dict[str, Any] | asyncio.Future[dict[str, Any]]
"""A reply, or the future of one (for a caller that sends its own replies: the future of one
already sent)."""
EnvFactory = Callable[[dict[str, Any]], Env]
"""Makes an env from a session's env args (merged over the server's)."""


@dataclass
class Caller:
    """Who sends requests: one WebSocket connection, or every HTTP client together."""

    owner: object | None
    """What the sessions it opens belong to (``None``: nobody; only the TTL ends them)."""
    creates: AnswerCache = field(default_factory=lambda: AnswerCache(256))
    """Answers to its ``create`` requests (they have no session to be cached in yet)."""
    batches: bool = False
    """It sends batches of requests (JSON arrays) and takes batches of replies."""
    send: Callable[[dict[str, Any]], Awaitable[None]] | None = None
    """Sends one reply to it, never raising (a WebSocket connection): the task that answers a
    request sends the reply as soon as it has it. ``None``: replies are awaited (HTTP)."""


class EnvService:
    """Serves one env: sessions of it, made by ``factory``.

    Args:
        factory: Makes a session's env from its env args.
        store: The session store (its limits and TTL).
        limits: What the server accepts, told to clients on ``create``.
    """

    def __init__(self, factory: EnvFactory, store: SessionStore, limits: p.Limits) -> None:
        self.factory, self.store, self.limits = factory, store, limits
        self.metrics = store.metrics

    def start(self, frame: str | bytes, caller: Caller) -> list[Answer]:
        """Start answering a frame: per request, its reply (an error, a close) or the future
        of it. A frame holds one request, or a batch of them (a JSON array) from a client
        that takes batches. Counts the requests and the errors answered now. A future's reply
        is sent by its task when the caller has :attr:`Caller.send` (the future is done once it
        was); otherwise the caller passes it through :meth:`done`."""
        try:
            payload = json.loads(frame)
        except json.JSONDecodeError as e:
            self.metrics.requests += 1
            error = p.RequestError(400, p.BAD_REQUEST, f"not JSON: {e}")
            return [self.done(p.error_reply(None, error))]
        batch = caller.batches and isinstance(payload, list) and len(payload) > 0
        return [self._start(item, caller) for item in (payload if batch else [payload])]

    def done(self, reply: dict[str, Any]) -> dict[str, Any]:
        """``reply``, counted (as an error if it is one), on its way out."""
        if not reply["ok"]:
            self.metrics.errors += 1
        return reply

    async def handle(self, frame: str | bytes, caller: Caller) -> dict[str, Any]:
        """The reply to a frame of one request (HTTP)."""
        [answer] = self.start(frame, caller)
        if isinstance(answer, dict):
            return answer
        return self.done(await asyncio.shield(answer))

    def refuse(self, error: p.RequestError) -> dict[str, Any]:
        """An error reply for a frame the app refused unread (too large), counted."""
        self.metrics.requests += 1
        return self.done(p.error_reply(None, error))

    def _start(self, payload: Any, caller: Caller) -> Answer:
        self.metrics.requests += 1
        try:
            request = p.parse_request(payload)
            if isinstance(request, p.CloseRequest):
                return self.done(self._close(request))
            if isinstance(request, p.CreateRequest):
                answer, replayed = caller.creates.start(
                    request.id, lambda: self._sent(caller, self._create(request, caller))
                )
            else:
                session = self.store.get(request.session)
                answer, replayed = session.answers.start(
                    request.id, lambda: self._sent(caller, self._in_session(session, request))
                )
        except p.RequestError as e:
            return self.done(p.error_reply(_id_of(payload), e))
        if replayed:
            self.metrics.replays += 1
            if caller.send is not None:  # the first answer went to whoever asked first
                return asyncio.ensure_future(self._sent(caller, asyncio.shield(answer)))
        return answer

    async def _sent(self, caller: Caller, work: Awaitable[dict[str, Any]]) -> dict[str, Any]:
        """The reply ``work`` makes, sent to ``caller`` (if it sends its own) from this task:
        no callback and no writer task between the env's answer and the socket."""
        reply = await work
        if caller.send is not None:
            await caller.send(self.done(reply))
        return reply

    async def _create(self, request: p.CreateRequest, caller: Caller) -> dict[str, Any]:
        try:
            self.store.reserve()
        except p.RequestError as e:
            return p.error_reply(request.id, e)
        try:
            env = await asyncio.to_thread(self.factory, p.decode(request.env_args))
        except Exception as e:
            self.store.release()
            return p.error_reply(request.id, _env_error(e, "making the env"))
        session = self.store.open(env, caller.owner)
        created = p.Created(session=session.id, info=env_info(env), limits=self.limits)
        return p.ok_reply(request.id, created)

    def _close(self, request: p.CloseRequest) -> dict[str, Any]:
        session = self.store.close(request.session)
        if session is not None:
            asyncio.ensure_future(close_env(session))
        return p.ok_reply(request.id, p.Closed(closed=session is not None))

    async def _in_session(self, session: Session, request: p.Request) -> dict[str, Any]:
        session.busy += 1
        try:
            async with session.lock:
                result = await self._call_env(session, request)
            return p.ok_reply(request.id, result)
        except p.RequestError as e:
            return p.error_reply(request.id, e)
        except Exception as e:
            return p.error_reply(request.id, _env_error(e, f"{request.op}"))
        finally:
            session.busy -= 1

    async def _call_env(self, session: Session, request: p.Request) -> Any:
        env = session.env
        if isinstance(request, p.ResetRequest):
            observation, info = await env.areset(
                seed=request.seed, options=p.decode(request.options)
            )
            self.metrics.resets += 1
            session.shown = 0
            return p.ResetResult(
                observation=p.encode(observation),
                info=p.encode(info),
                tool_schemas=env.tool_schemas,
                remaining_tokens=env.remaining_tokens,
                state=episode_view(session, observation),
            )
        if isinstance(request, p.StepRequest):
            observation, reward, terminated, truncated, info = await env.astep(
                p.decode(request.action)
            )
            self.metrics.steps += 1
            return p.step_result(
                p.encode(observation),
                reward,
                terminated,
                truncated,
                p.encode(info),
                env.remaining_tokens,
                episode_view(session, observation),
            )
        if isinstance(request, p.TruncateRequest):
            if not isinstance(env, TaskEnv):
                raise p.RequestError(
                    400, p.BAD_REQUEST, f"{env.name} is not a TaskEnv; only a TaskEnv can truncate"
                )
            reward, info = await env.atruncate(request.reason)
            state = episode_view(session, [])
            return p.TruncateResult(reward=reward, info=p.encode(info), state=state)
        if isinstance(request, p.ToolsRequest):
            return p.ToolsResult(tool_schemas=env.tool_schemas)
        return p.InfoResult(info=env_info(env))

    async def expire(self) -> int:
        """Close every session idle for longer than the TTL; how many were closed."""
        sessions = self.store.expired()
        await asyncio.gather(*(close_env(s) for s in sessions))
        return len(sessions)

    async def disconnected(self, caller: Caller) -> None:
        """Close the sessions a WebSocket connection opened; it went away."""
        sessions = self.store.owned_by(caller.owner)
        if sessions:
            logger.info("a connection went away; closing its %d session(s)", len(sessions))
        await asyncio.gather(*(close_env(s) for s in sessions))

    async def shutdown(self) -> None:
        """Refuse new sessions and close every open one."""
        sessions = self.store.drain()
        await asyncio.gather(*(close_env(s) for s in sessions))
        logger.info("closed %d session(s) on shutdown", len(sessions))


def env_info(env: Env) -> p.EnvInfo:
    """What a client needs to know about ``env`` (name, budgets, tools, spaces, ...)."""
    from envhub.hub.provenance import env_ref

    return p.EnvInfo(
        ref=env_ref(env),
        reward_range=tuple(env.reward_range),
        pass_threshold=env.pass_threshold,
        audit_floor=env.audit_floor,
        max_turns=getattr(env, "max_turns", None),
        max_tokens=getattr(env, "max_tokens", None),
        tool_schemas=env.tool_schemas,
        observation_space=repr(env.observation_space),
        action_space=repr(env.action_space),
        metadata=p.encode(dict(env.metadata)),
    )


def episode_view(session: Session, observation: list[Any]) -> dict[str, Any] | None:
    """What changed in the state of the session's ``TaskEnv`` since the client last heard
    (``None`` for other envs). The observation, when the state ends with it (a ``TaskEnv``
    appends its reply to the state), is left out: it travels once, as the observation."""
    state = session.env.state if isinstance(session.env, TaskEnv) else None
    if state is None:
        return None
    start = min(session.shown, len(state.messages))
    new = state.messages[start:]
    n = len(observation)
    follows = 0 < n <= len(new) and all(a is b for a, b in zip(new[-n:], observation, strict=True))
    session.shown = len(state.messages)
    return p.episode_state(
        start,
        p.encode(new[:-n] if follows else new),
        follows,
        state.turn,
        state.tokens,
        state.metrics,
        state.stop_reason,
        state.reward_components,
    )


def _id_of(payload: Any) -> str | None:
    """The request id of a frame, if it has a usable one (to answer even a malformed request)."""
    request_id = payload.get("id") if isinstance(payload, dict) else None
    return request_id if isinstance(request_id, str) else None


def _env_error(error: Exception, doing: str) -> p.RequestError:
    """The env's own exception, as an error reply (500) naming its class."""
    logger.warning("the env raised while %s", doing, exc_info=error)
    return p.RequestError(500, type(error).__name__, str(error) or type(error).__name__)
