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

The token comes from ``token=`` or the ``ENVHUB_SERVE_TOKEN`` environment variable.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from pydantic import BaseModel

from envhub.env import Action, Env, StepResult
from envhub.errors import ConfigError, RemoteEnvError, RemoteEnvUnavailableError
from envhub.serve import protocol as p
from envhub.serve.client import IO, Transport, acquire, raise_for_error, release
from envhub.types import EnvRef, Message

R = TypeVar("R", bound=BaseModel)
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
        timeout: Seconds to wait for each answer before sending the request again (same id).
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
        self._transport: Transport = IO.run(acquire(self.url, token, timeout))
        self._session: str | None = None
        self._generation = 0
        self._limits: p.Limits | None = None
        self._tools: list[dict[str, Any]] | None = None
        self._remaining: int | None = None
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
    def remaining_tokens(self) -> int | None:
        """Tokens left under the env's ``max_tokens`` after the last reset or step."""
        return self._remaining

    def _describe(self, info: p.EnvInfo) -> None:
        self.info = info
        self.name, self.version = info.ref.name, info.ref.version or "0.0.0"
        self.reward_range, self.pass_threshold = info.reward_range, info.pass_threshold
        self.audit_floor = info.audit_floor
        self.max_turns, self.max_tokens = info.max_turns, info.max_tokens
        self.metadata = p.decode(info.metadata)
        self._tools = info.tool_schemas

    # -- the gym API: the sync and async forms run the same coroutine on the I/O loop ----------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode on the server; see :meth:`Env.reset`."""
        return IO.run(self._reset(seed, options))

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Async form of :meth:`reset`."""
        return await IO.arun(self._reset(seed, options))

    def step(self, action: Action) -> StepResult:
        """Send one assistant turn; see :meth:`Env.step`."""
        return IO.run(self._step(action))

    async def astep(self, action: Action) -> StepResult:
        """Async form of :meth:`step`."""
        return await IO.arun(self._step(action))

    def on_close(self) -> None:
        """Close the session on the server (best effort) and let go of the connection."""
        IO.run(self._close())

    # -- on the I/O loop ----------------------------------------------------------------------

    async def _create(self) -> None:
        request = p.CreateRequest(id=_new_id(), op="create", env_args=p.encode(self.env_args))
        created, generation = await self._call(request, p.Created)
        self._session, self._generation, self._limits = (
            created.session,
            generation,
            created.limits,
        )
        self._describe(created.info)

    async def _reset(
        self, seed: int | None, options: dict[str, Any] | None
    ) -> tuple[list[Message], dict[str, Any]]:
        self._in_episode = False
        if self._session is None or not self._transport.alive(self._generation):
            await self._create()  # the old session went with its connection
        request = p.ResetRequest(
            id=_new_id(), op="reset", session=self._session, seed=seed, options=p.encode(options)
        )
        try:
            result, _ = await self._call(request, p.ResetResult)
        except RemoteEnvUnavailableError:
            # Expired while idle, or the server restarted: between episodes, start afresh.
            await self._create()
            request = request.model_copy(update={"id": _new_id(), "session": self._session})
            result, _ = await self._call(request, p.ResetResult)
        self._tools, self._remaining = result.tool_schemas, result.remaining_tokens
        self._in_episode = True
        return p.decode(result.observation), p.decode(result.info)

    async def _step(self, action: Action) -> StepResult:
        if self._session is None or not self._transport.alive(self._generation):
            raise self._lost("the connection dropped")
        request = p.StepRequest(
            id=_new_id(), op="step", session=self._session, action=p.encode(action)
        )
        try:
            result, _ = await self._call(request, p.StepResult)
        except RemoteEnvUnavailableError as e:
            raise self._lost(str(e)) from e
        self._remaining = result.remaining_tokens
        return (
            p.decode(result.observation),
            result.reward,
            result.terminated,
            result.truncated,
            p.decode(result.info),
        )

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
                await self._call(request, p.Closed, timeout=5.0)
        except RemoteEnvError:
            pass  # the server is gone: so is the session
        finally:
            self._session = None
            await release(self._transport)

    async def _call(
        self, request: p.Request, result_type: type[R], timeout: float | None = None
    ) -> tuple[R, int]:
        """Send ``request``; ``(result, connection generation)``, or raise the reply's error."""
        frame = p.dumps(request.model_dump(mode="json"))
        limit = self._limits.max_message_bytes if self._limits else None
        if limit is not None and len(frame.encode()) > limit:
            raise RemoteEnvError(
                f"the {request.op} request is {len(frame.encode())} bytes; the server at "
                f"{self.url} accepts at most {limit} (envhub serve --max-message-bytes)",
                remote_type=p.TOO_LARGE,
            )
        reply, generation = await self._transport.request(
            frame, request.id, timeout or self.timeout, self.retries
        )
        if not reply["ok"]:
            raise_for_error(reply["error"], self.url, request.op)
        return result_type.model_validate(reply["result"]), generation


def _new_id() -> str:
    return uuid.uuid4().hex
