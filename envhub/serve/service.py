"""The env service: requests in, ``Env`` calls, replies out. No transport here.

The app (:mod:`envhub.serve.app`) reads a frame's requests with :meth:`EnvService.prepare_frame`
(parsed, their values decoded within bounds; no session touched, so a large frame may be read in
a worker thread) and starts each with :meth:`EnvService.launch` (over HTTP,
:meth:`EnvService.handle` does both); this module never raises into it: every failure is an
error reply on the request's id. A session's request that carries a number (``seq``) already
started, whose answer is no longer cached, is refused (409 ``stale_retry``), never run again.

Env calls go through ``areset``/``astep``: natively async envs run on the server's loop, sync
ones in a worker thread (the ``Env`` default), so a slow env never stalls the others. Making
and closing envs also run in worker threads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from envhub.env import Env, TaskEnv
from envhub.serve import protocol as p
from envhub.serve.bounds import DecodeLimits, UnreadableFrame, decode_bounded, read_frame
from envhub.serve.sessions import AnswerCache, Session, SessionStore, close_env

logger = logging.getLogger(__name__)

Answer = dict[str, Any] | asyncio.Future[dict[str, Any]]
"""A reply, or the future of one (for a caller that sends its own replies: the future of one
already sent)."""
OFF_LOOP_BYTES = 512 * 1024
"""Frames larger than this are parsed and their values decoded in a worker thread: the loop
goes on serving other clients meanwhile (a 4 MB frame takes ~40 ms to read). Smaller ones,
such as a 1024-session batch (~110 KB), are read on the loop: a thread hand-off costs more."""
Prepared = tuple[Any, Any, dict[str, Any] | None]
"""A request read off a frame: ``(request, its decoded value, None)``, or ``(None, None, the
error reply)`` when it cannot be run (see :meth:`EnvService.prepare`)."""
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
    busy: Callable[[], bool] = lambda: False
    """Whether other requests of it are running. A request that runs alone starts eagerly
    (answered in the loop iteration that read it: one session's latency); with others
    running, as a task (starting ~1000 at once eagerly cost ~10 us of CPU each)."""
    send: Callable[[dict[str, Any]], Awaitable[None]] | None = None
    """Sends one reply to it, never raising (a WebSocket connection): the task that answers a
    request sends the reply as soon as it has it. ``None``: replies are awaited (HTTP)."""
    turn: Callable[[], asyncio.Future[None] | None] = lambda: None
    """Called as one of its requests (not started eagerly) is about to run: ``None`` if it may
    run now, else a future to await first (its connection takes turns with the others)."""


class EnvService:
    """Serves one env: sessions of it, made by ``factory``.

    Args:
        factory: Makes a session's env from its env args.
        store: The session store (its limits and TTL).
        limits: What the server accepts, told to clients on ``create``.
    """

    def __init__(
        self,
        factory: EnvFactory,
        store: SessionStore,
        limits: p.Limits,
        decode_limits: DecodeLimits | None = None,
    ) -> None:
        self.factory, self.store, self.limits = factory, store, limits
        self.decode_limits = decode_limits or DecodeLimits(
            max_depth=limits.max_depth,
            max_items=limits.max_items,
            max_array_bytes=limits.max_array_bytes,
        )
        self.metrics = store.metrics

    def prepare_frame(self, frame: str | bytes, caller: Caller) -> list[Prepared]:
        """The requests of a frame, each parsed and its value decoded within bounds: the one it
        holds, or those of a batch (a JSON array) from a caller that takes batches. Touches no
        session: a large frame may be prepared in a worker thread, off the loop.

        Raises:
            UnreadableFrame: Not UTF-8 or not JSON (its ``request_id``: the frame's id, if it
                starts with one); answer it with :meth:`refuse`.
        """
        return [self.prepare(payload) for payload in self.payloads(frame, caller)]

    def payloads(self, frame: str | bytes, caller: Caller) -> list[Any]:
        """The requests of a frame as parsed JSON, not yet checked (:meth:`prepare` each).

        Raises:
            UnreadableFrame: As :meth:`prepare_frame`.
        """
        payload = read_frame(frame)
        batch = caller.batches and isinstance(payload, list) and len(payload) > 0
        return payload if batch else [payload]

    def prepare(self, payload: Any) -> Prepared:
        """One request (decoded JSON) parsed, and its value (a step's action, a reset's options,
        a create's env args) decoded within bounds; or the error reply it gets. Never raises."""
        try:
            request = p.parse_request(payload)
            return request, self._value(request), None
        except p.RequestError as e:
            return None, None, p.error_reply(_id_of(payload), e)
        except Exception as e:  # a bug of the server's: this request fails, the others go on
            logger.exception("reading a request failed")
            return None, None, p.error_reply(_id_of(payload), _server_error(e))

    def done(self, reply: dict[str, Any]) -> dict[str, Any]:
        """``reply``, counted (as an error if it is one), on its way out."""
        if not reply["ok"]:
            self.metrics.errors += 1
        return reply

    async def handle(self, frame: str | bytes, caller: Caller) -> dict[str, Any]:
        """The reply to a frame of one request (HTTP)."""
        try:
            if len(frame) > OFF_LOOP_BYTES:
                [prepared] = await asyncio.to_thread(self.prepare_frame, frame, caller)
            else:
                [prepared] = self.prepare_frame(frame, caller)
        except UnreadableFrame as e:
            return self.refuse(e, e.request_id)
        answer = self.launch(prepared, caller)
        if isinstance(answer, dict):
            return answer
        return self.done(await asyncio.shield(answer))

    def refuse(self, error: p.RequestError, request_id: str | None = None) -> dict[str, Any]:
        """An error reply for a frame refused before its requests were read (too large, not
        JSON), counted."""
        self.metrics.requests += 1
        return self.done(p.error_reply(request_id, error))

    def launch(self, prepared: Prepared, caller: Caller) -> Answer:
        """Start answering a prepared request: its reply when it is answered at once (an error,
        a close), else the future of it. A future's reply is sent by its task when the caller
        has :attr:`Caller.send` (the future is done once it was); otherwise the caller passes it
        through :meth:`done`. Counts the request (and the errors answered now); never raises."""
        self.metrics.requests += 1
        request, value, refused = prepared
        if refused is not None:
            return self.done(refused)
        try:
            return self._launch(request, value, caller)
        except p.RequestError as e:
            return self.done(p.error_reply(request.id, e))
        except Exception as e:  # a bug of the server's: this request fails, the others go on
            logger.exception("answering a request failed")
            return self.done(p.error_reply(request.id, _server_error(e)))

    def _launch(self, request: p.Request, value: Any, caller: Caller) -> Answer:
        if isinstance(request, p.CloseRequest):
            return self.done(self._close(request))
        if isinstance(request, p.CreateRequest):
            answer = caller.creates.get(request.id)
            if answer is None:
                return caller.creates.start(
                    request.id, lambda: self._sent(caller, self._create(request, value, caller))
                )
        else:
            session = self.store.get(request.session)
            answer = session.answers.get(request.id)
            if answer is None:
                if request.seq is not None and not session.sequence.take(request.seq):
                    raise _stale(request, session)
                eager = not caller.busy()
                turn = None if eager else caller.turn
                return session.answers.start(
                    request.id,
                    lambda: self._sent(caller, self._in_session(session, request, value, turn)),
                    eager=eager,
                )
        self.metrics.replays += 1
        if caller.send is not None:  # the first answer went to whoever asked first
            return asyncio.ensure_future(self._sent(caller, asyncio.shield(answer)))
        return answer

    def _value(self, request: p.Request) -> Any:
        """The request's value, decoded within bounds."""
        if isinstance(request, p.StepRequest):
            return decode_bounded(request.action, self.decode_limits, "action")
        if isinstance(request, p.ResetRequest):
            return decode_bounded(request.options, self.decode_limits, "options")
        if isinstance(request, p.CreateRequest):
            return decode_bounded(request.env_args, self.decode_limits, "env_args")
        return None

    async def _sent(self, caller: Caller, work: Awaitable[dict[str, Any]]) -> dict[str, Any]:
        """The reply ``work`` makes, sent to ``caller`` (if it sends its own) from this task:
        no callback and no writer task between the env's answer and the socket."""
        reply = await work
        if caller.send is not None:
            await caller.send(self.done(reply))
        return reply

    async def _create(
        self, request: p.CreateRequest, args: dict[str, Any], caller: Caller
    ) -> dict[str, Any]:
        try:
            self.store.reserve()
        except p.RequestError as e:
            return p.error_reply(request.id, e)
        try:
            env = await asyncio.to_thread(self.factory, args)
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

    async def _in_session(
        self,
        session: Session,
        request: p.Request,
        value: Any,
        turn: Callable[[], asyncio.Future[None] | None] | None = None,
    ) -> dict[str, Any]:
        session.busy += 1
        try:
            async with session.lock:
                waiting = turn() if turn is not None else None
                if waiting is not None:
                    await waiting
                result = await self._call_env(session, request, value)
            return p.ok_reply(request.id, result)
        except p.RequestError as e:
            return p.error_reply(request.id, e)
        except Exception as e:
            return p.error_reply(request.id, _env_error(e, f"{request.op}"))
        finally:
            session.busy -= 1

    async def _call_env(self, session: Session, request: p.Request, value: Any) -> Any:
        """Run the request on the session's env (``value``: its decoded action or options)."""
        env = session.env
        if isinstance(request, p.ResetRequest):
            observation, info = await env.areset(seed=request.seed, options=value)
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
            observation, reward, terminated, truncated, info = await env.astep(value)
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
        multi_role=env.multi_role,
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


def _server_error(error: Exception) -> p.RequestError:
    return p.RequestError(500, type(error).__name__, f"the server failed on this request: {error}")


def _stale(request: p.Request, session: Session) -> p.RequestError:
    return p.RequestError(
        409,
        p.STALE_RETRY,
        f"request {request.id!r} (seq {request.seq}) of session {session.id} was started before "
        f"and its answer is no longer kept (the session is at seq {session.sequence.highest}); "
        "it was not run again",
    )


def _env_error(error: Exception, doing: str) -> p.RequestError:
    """The env's own exception, as an error reply (500) naming its class."""
    logger.warning("the env raised while %s", doing, exc_info=error)
    return p.RequestError(500, type(error).__name__, str(error) or type(error).__name__)
