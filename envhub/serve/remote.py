"""``RemoteEnv``: an env served by ``envhub serve``, used exactly like a local one.

``envhub.make("ws://host:8765/calculator?max_turns=3")`` (or ``http://...``) opens a session on
the server and returns a :class:`RemoteEnv`: the same observations, rewards, infos and tool
schemas as the local env under the same seeds, through ``reset``/``step`` and
``areset``/``astep``. Query parameters and extra keyword arguments are the env's constructor
arguments (query values are read as JSON when they parse: ``max_turns=3`` is the number 3).

Failures, as the rollout runner records them:

- the env raised on the server -> :class:`~envhub.errors.RemoteEnvError` (an env failure);
- the connection dropped, the server is gone or full, or the session expired ->
  :class:`~envhub.errors.RemoteEnvUnavailableError`, a ``ConnectionError`` (an infrastructure
  failure). Between episodes ``reset`` opens a new session instead; mid-episode the episode is
  lost, and the error says so.

When the served env is a ``TaskEnv``, :attr:`RemoteEnv.state` is a copy of its episode state
(messages with the assistant turns' parsed tool calls, turn and token counts, metrics, stop
reason; not the task row or the env's scratch ``data``), kept up to date by every answer, and
:meth:`RemoteEnv.atruncate` ends and scores an episode as ``TaskEnv.atruncate`` does: the rollout
runner records the same trajectory as on the local env.

``reset``/``step`` run on an I/O thread (from any thread); ``areset``/``astep`` run on the
caller's loop, over its own connection (see :mod:`envhub.serve.client`).

The token comes from ``token=`` or the ``ENVHUB_SERVE_TOKEN`` environment variable.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import secrets
from collections import Counter
from collections.abc import Coroutine
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from pydantic import BaseModel

from envhub.env import Action, Env, StepResult
from envhub.errors import ConfigError, RemoteEnvError, RemoteEnvUnavailableError
from envhub.serve import protocol as p
from envhub.serve.client import (
    IO,
    Transport,
    acquire,
    nearby,
    raise_for_error,
    release,
)
from envhub.state import State
from envhub.types import EnvRef, Message

R = TypeVar("R", bound=BaseModel)
T = TypeVar("T")
SCHEMES = ("ws", "wss", "http", "https")


def parse_value(text: str) -> Any:
    """A URL query or ``--arg`` value: JSON when it parses (``3``, ``true``, ``[1, 2]``), else
    the text itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_url(url: str) -> tuple[str, dict[str, Any]]:
    """``(endpoint, env args)`` of a remote env URL: the URL without its query, and the query.

    Raises:
        ConfigError: Not a ``ws``, ``wss``, ``http`` or ``https`` URL with a host.
    """
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES or not parts.netloc:
        raise ConfigError(
            f"{url!r} is not a remote env URL; expected ws://HOST:PORT/ENV (or wss, http, https)"
        )
    args = {k: parse_value(v) for k, v in parse_qsl(parts.query, keep_blank_values=True)}
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "", "")), args


class RemoteEnv(Env):
    """An env on an ``envhub serve`` server; see the module docstring.

    Args:
        url: ``ws://HOST:PORT/ENV[?ARG=VALUE...]`` (or ``http://``, ``wss://``, ``https://``).
        token: Bearer token (default: ``$ENVHUB_SERVE_TOKEN``).
        timeout: Seconds to wait for each answer before sending the request again (same id;
            over WebSocket noticed up to a quarter of it later: one timer serves all requests).
        retries: How many times to send a request again before giving up.
        **env_args: Constructor arguments for the env (over the URL's query ones).

    Raises:
        RemoteEnvError: The server refused the token or the arguments, or the env failed to make.
        RemoteEnvUnavailableError: The server cannot be reached or is full.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout: float | None = 60.0,
        retries: int = 2,
        **env_args: Any,
    ) -> None:
        super().__init__()
        self.url, query_args = parse_url(url)
        self.env_args = {**query_args, **env_args}
        self.timeout, self.retries = timeout, retries
        token = token if token is not None else os.environ.get("ENVHUB_SERVE_TOKEN") or None
        self._token = token
        self._near: tuple[object, Transport | None] = (None, None)
        """The last loop that called an async method, and its transport."""
        # The I/O loop's transport: opens and closes the session, carries the sync calls.
        self._transport: Transport = IO.run(acquire(self.url, token, timeout))
        self._session: str | None = None
        self._seq = itertools.count(1)
        """Numbers the session's requests (the server tells a late retry from a new request)."""
        self._generation = 0
        self._limits: p.Limits | None = None
        self._tools: list[dict[str, Any]] | None = None
        self._remaining: int | None = None
        self._state: State | None = None
        self._in_episode = False
        try:
            IO.run(self._create())
        except BaseException:
            IO.run(release(self._transport))
            raise

    # -- what the env is ----------------------------------------------------------------------

    @property
    def ref(self) -> EnvRef:
        """The served env's name, version and commit."""
        return self.info.ref

    @property
    def tool_schemas(self) -> list[dict[str, Any]] | None:
        """The tool schemas of the current episode (of the session's env before any reset)."""
        return self._tools

    @property
    def state(self) -> State | None:
        """A copy of the served ``TaskEnv``'s episode state (``None`` before a reset, and for
        other envs): messages, turn and token counts, metrics, stop reason, reward components.
        Its ``task`` and ``data`` are empty: they stay on the server."""
        return self._state

    @property
    def remaining_tokens(self) -> int | None:
        """Tokens left under the env's ``max_tokens`` after the last reset or step."""
        return self._remaining

    @property
    def multi_role(self) -> bool:
        """Whether the served env's episodes are matches between several actors."""
        return self.info.multi_role

    def _describe(self, info: p.EnvInfo) -> None:
        self.info = info
        self.name, self.version = info.ref.name, info.ref.version or "0.0.0"
        self.reward_range, self.pass_threshold = info.reward_range, info.pass_threshold
        self.audit_floor = info.audit_floor
        self.max_turns, self.max_tokens = info.max_turns, info.max_tokens
        self.metadata = p.decode(info.metadata)
        self._tools = info.tool_schemas

    # -- the gym API: sync forms on the I/O loop, async forms on the caller's loop --------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode on the server; see :meth:`Env.reset`."""
        return IO.run(self._reset(seed, options, self._transport))

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Async form of :meth:`reset`."""
        return await self._reset(seed, options, self._nearby())

    def step(self, action: Action) -> StepResult:
        """Send one assistant turn; see :meth:`Env.step`."""
        return IO.run(self._step(action, self._transport))

    async def astep(self, action: Action) -> StepResult:
        """Async form of :meth:`step`."""
        return await self._step(action, self._nearby())

    async def atruncate(self, reason: str) -> tuple[float, dict[str, Any]]:
        """End the served ``TaskEnv``'s episode from outside and score it; see
        :meth:`TaskEnv.atruncate`.

        Raises:
            RemoteEnvError: The env is not a ``TaskEnv``, or no episode is active.
            RemoteEnvUnavailableError: The session was lost.
        """
        request = p.TruncateRequest(
            id=_new_id(),
            op="truncate",
            session=self._require_session(),
            seq=self._next_seq(),
            reason=reason,
        ).model_dump(exclude_none=True)
        try:
            result, _ = await self._call(request, p.TruncateResult, self._nearby())
        except RemoteEnvUnavailableError as e:
            raise self._lost(str(e)) from e
        self._in_episode = False
        self._update_state(result.state, [])
        return result.reward, p.decode(result.info)

    def on_close(self) -> None:
        """Close the session on the server (best effort) and let go of the connection(s)."""
        IO.run(self._close())

    def _nearby(self) -> Transport:
        """The transport of the running loop (the I/O loop's own when called there)."""
        loop = asyncio.get_running_loop()
        if self._near[0] is not loop:
            here = (
                self._transport if IO.is_current() else nearby(self.url, self._token, self.timeout)
            )
            self._near = (loop, here)
        return self._near[1]

    # -- on any loop (sessions are opened and closed on the I/O loop) -------------------------

    async def _on_io(self, coro: Coroutine[Any, Any, T]) -> T:
        return await coro if IO.is_current() else await IO.arun(coro)

    async def _create(self) -> None:
        request = p.CreateRequest(
            id=_new_id(), op="create", env_args=p.encode(self.env_args)
        ).model_dump(mode="json")
        created, generation = await self._call(request, p.Created, self._transport)
        self._session, self._generation, self._limits = (
            created.session,
            generation,
            created.limits,
        )
        self._seq = itertools.count(1)
        self._describe(created.info)

    async def _reset(
        self, seed: int | None, options: dict[str, Any] | None, via: Transport
    ) -> tuple[list[Message], dict[str, Any]]:
        self._in_episode, self._state = False, None
        if self._session is None or not self._transport.alive(self._generation):
            await self._on_io(self._create())  # the old session went with its connection
        request = p.reset_request(_new_id(), self._session, seed, options, self._next_seq())
        try:
            result, _ = await self._call(request, p.ResetResult, via)
        except RemoteEnvUnavailableError:
            # Expired while idle, or the server restarted: between episodes, start afresh.
            await self._on_io(self._create())
            request = p.reset_request(_new_id(), self._session, seed, options, self._next_seq())
            result, _ = await self._call(request, p.ResetResult, via)
        self._tools, self._remaining = result.tool_schemas, result.remaining_tokens
        self._in_episode = True
        observation = p.decode(result.observation)
        if result.state is not None:
            info = p.decode(result.info)
            self._state = State(
                task={}, task_index=info.get("task_index", -1), prompt=[], messages=[]
            )
            self._update_state(result.state, observation)
            self._state.prompt = list(self._state.messages)
            return observation, info
        return observation, p.decode(result.info)

    async def _step(self, action: Action, via: Transport) -> StepResult:
        session = self._require_session()
        request = p.step_request(_new_id(), session, action, self._next_seq())
        try:
            result, _ = await self._call(request, p.StepResult, via)
        except RemoteEnvUnavailableError as e:
            raise self._lost(str(e)) from e
        self._remaining = result.remaining_tokens
        observation = p.decode(result.observation)
        self._update_state(result.state, observation)
        return (
            observation,
            result.reward,
            result.terminated,
            result.truncated,
            p.decode(result.info),
        )

    def _next_seq(self) -> int | None:
        """The session's next request number (``None``: the server takes none)."""
        numbered = self._limits is not None and self._limits.request_numbers
        return next(self._seq) if numbered else None

    def _require_session(self) -> str:
        if self._session is None or not self._transport.alive(self._generation):
            raise self._lost("the connection dropped")
        return self._session

    def _update_state(self, view: p.EpisodeView | None, observation: list[Message]) -> None:
        """Apply an answer's :class:`~envhub.serve.protocol.EpisodeView` to :attr:`state`."""
        state = self._state
        if view is None or state is None:
            return
        new = p.decode(view.messages) + (observation if view.observation_follows else [])
        state.messages[view.start :] = new
        state.turn, state.tokens, state.stop_reason = view.turn, view.tokens, view.stop_reason
        state.metrics = Counter(view.metrics)
        state.reward_components = dict(view.reward_components)

    def _lost(self, why: str) -> RemoteEnvUnavailableError:
        where = "mid-episode" if self._in_episode else "before the episode started"
        self._in_episode = False
        return RemoteEnvUnavailableError(
            f"{self.name} at {self.url}: the session was lost {where} ({why}); this episode "
            "cannot go on. The next reset() opens a new session."
        )

    async def _close(self) -> None:
        try:
            if self._session is not None and self._transport.alive(self._generation):
                request = p.CloseRequest(id=_new_id(), op="close", session=self._session)
                request = request.model_dump()
                await self._call(request, p.Closed, self._transport, timeout=5.0)
        except RemoteEnvError:
            pass  # the server is gone: so is the session
        finally:
            self._session = None
            await release(self._transport)

    async def _call(
        self,
        request: dict[str, Any],
        result_type: type[R],
        via: Transport,
        timeout: float | None = None,
    ) -> tuple[R, int]:
        """Send ``request`` (a request's JSON-ready data) over ``via``; ``(result, connection
        generation)``, or raise the reply's error."""
        frame = p.dumps(request)
        limit = self._limits.max_message_bytes if self._limits else None
        if limit is not None and len(frame) > limit // 4 and len(frame.encode()) > limit:
            raise RemoteEnvError(
                f"the {request['op']} request is {len(frame.encode())} bytes; the server at "
                f"{self.url} accepts at most {limit} (envhub serve --max-message-bytes)",
                remote_type=p.TOO_LARGE,
            )
        reply, generation = await via.request(
            frame, request["id"], timeout or self.timeout, self.retries
        )
        if not reply["ok"]:
            raise_for_error(reply["error"], self.url, request["op"])
        return result_type.model_validate(reply["result"]), generation


_ids = [secrets.token_hex(8), itertools.count()]


def _new_id() -> str:
    """A request id unique to this process: a random prefix and a counter (cheaper than a
    UUID per request; ``next`` on a count is atomic under the GIL)."""
    return f"{_ids[0]}-{next(_ids[1])}"


def _fresh_ids() -> None:
    _ids[:] = [secrets.token_hex(8), itertools.count()]


os.register_at_fork(after_in_child=_fresh_ids)  # a forked child must not reuse the parent's ids
