"""OpenEnv servers as envhub envs: ``envhub.make("openenv:http://HOST:PORT")``.

An OpenEnv env (``pip install 'envhub[openenv]'``, the ``openenv-core`` package) lives behind a
server; the name is its URL (``http``, ``https``, ``ws`` or ``wss``), and a query or keyword
arguments set the options below (``openenv:http://HOST:PORT?max_turns=4``). Episodes run over
the server's WebSocket ``/ws`` with OpenEnv's own ``GenericEnvClient``: that is where OpenEnv
keeps a session (its HTTP ``/reset`` and ``/step`` make a fresh env for every call).

The mapping, for text-in/text-out envs (an echo env, text games, envs that take code or a
command as one string):

- **action**: the assistant turn's text becomes one string field of the env's action:
  ``action_field``, or else the action schema's only string field, or else the first of
  :data:`TEXT_FIELDS` it has. ``action_defaults`` fills any other fields the action needs.
- **observation**: one string field of the observation becomes a user message:
  ``observation_field``, or found the same way in the observation schema. The reset
  observation is the prompt (after ``system_prompt``, if given).
- **reward**: each step's reward (``None`` -> 0.0); the episode's reward is their sum.
- **done** -> ``terminated``; after ``max_turns`` steps without it the episode is ``truncated``.
- **info**: ``{"observation": <the whole observation>, "turn": n}``; ``reset(options=...)``
  sends the options as extra reset arguments (OpenEnv passes those its env's reset takes).

An env whose action needs fields the adapter cannot fill, or whose observation has no text,
fails when made with :class:`~envhub.errors.EnvLoadError` naming the fields and the option to
set. Failures while running, as the rollout runner records them: the server unreachable or the
connection lost -> :class:`~envhub.errors.RemoteEnvUnavailableError` (infrastructure; between
episodes, ``reset`` connects again); an error the server reports ->
:class:`~envhub.errors.RemoteEnvError` (the env's failure).

OpenEnv has no catalog of envs to list: :func:`list_envs` returns ``{}``.
"""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Any

from envhub.env import Action, Env, StepResult, as_turn
from envhub.errors import (
    EnvhubError,
    EnvLoadError,
    EnvNotFoundError,
    MissingDependencyError,
    RemoteEnvError,
    RemoteEnvUnavailableError,
)
from envhub.types import Message, system, user

TEXT_FIELDS = ("message", "text", "content", "prompt", "response", "answer", "code", "command")
"""Field names tried, in order, when a schema has several string fields."""
RESERVED = frozenset({"metadata", "reward", "done"})
"""OpenEnv's own fields: never the text (and never sent in an observation's body)."""


def list_envs() -> dict[str, str]:
    """Nothing: OpenEnv envs are servers, named by URL (``openenv:http://HOST:PORT``)."""
    return {}


def make_env(name: str, **kwargs: Any) -> OpenEnvEnv:
    """The OpenEnv env served at the URL ``name``; see the module docstring for ``kwargs``.

    Raises:
        MissingDependencyError: openenv-core is not installed.
        EnvNotFoundError: ``name`` is not a URL.
        RemoteEnvUnavailableError: Nothing answers at the URL.
        EnvLoadError: The env's action or observation cannot be mapped to text.
    """
    if importlib.util.find_spec("openenv") is None:
        raise MissingDependencyError.for_extra("openenv-core", "openenv")
    from envhub.errors import ConfigError
    from envhub.serve.remote import parse_url

    try:
        url, query = parse_url(name)
    except ConfigError:
        raise EnvNotFoundError(
            f"openenv:{name}: name an OpenEnv server by its URL, e.g. openenv:http://HOST:PORT"
        ) from None
    return OpenEnvEnv(url, **{**query, **kwargs})


class OpenEnvEnv(Env):
    """An env on an OpenEnv server, driven through OpenEnv's ``GenericEnvClient``.

    Args:
        url: The server's base URL (``http://HOST:PORT``; ``ws://`` works too).
        action_field: The action field the model's text goes into (default: found from the
            server's ``/schema``).
        observation_field: The observation field shown to the model (default: found the same
            way).
        action_defaults: Values for the action's other fields, sent with every step.
        system_prompt: A system message put before the reset observation.
        max_turns: Steps after which an episode that is not done is truncated (``None``: none).
        timeout: Seconds to wait for the server's answer to each call.
        reward_range: Bounds of an episode's total reward, if the env has known ones.

    Raises:
        RemoteEnvUnavailableError: Nothing answers at ``url``.
        EnvLoadError: The action or observation cannot be mapped to text.
    """

    def __init__(
        self,
        url: str,
        *,
        action_field: str | None = None,
        observation_field: str | None = None,
        action_defaults: dict[str, Any] | None = None,
        system_prompt: str | None = None,
        max_turns: int | None = 32,
        timeout: float = 60.0,
        reward_range: tuple[float, float] | None = None,
    ) -> None:
        super().__init__()
        self.url = url.rstrip("/")
        self.http_url = _http_url(self.url)
        self.timeout, self.max_turns, self.system_prompt = timeout, max_turns, system_prompt
        self.action_defaults = dict(action_defaults or {})
        if reward_range is not None:
            self.reward_range = (float(reward_range[0]), float(reward_range[1]))
        schema, described = self._fetch("/schema"), self._fetch("/metadata")
        self.name = f"openenv:{described.get('name') or 'env'}"
        self.version = described.get("version") or "0.0.0"
        self.action_field = _text_field(schema["action"], action_field, "action")
        self.observation_field = _text_field(
            schema["observation"], observation_field, "observation"
        )
        _check_action_fillable(schema["action"], self.action_field, self.action_defaults)
        self._client: Any = None
        self._turn = 0
        self._in_episode = False

    # -- the gym API: every call runs on envhub's I/O loop, where the connection lives ---------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode on the server; ``options`` go to its reset as extra arguments."""
        from envhub.serve.client import IO

        return IO.run(self._reset(seed, options))

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Async form of :meth:`reset`."""
        from envhub.serve.client import IO

        return await IO.arun(self._reset(seed, options))

    def step(self, action: Action) -> StepResult:
        """Send the turn's text as the action; see the module docstring for the mapping."""
        from envhub.serve.client import IO

        return IO.run(self._step(action))

    async def astep(self, action: Action) -> StepResult:
        """Async form of :meth:`step`."""
        from envhub.serve.client import IO

        return await IO.arun(self._step(action))

    def on_close(self) -> None:
        """Close the session (the WebSocket connection) on the server."""
        from envhub.serve.client import IO

        IO.run(self._disconnect())

    # -- on the I/O loop ----------------------------------------------------------------------

    async def _reset(
        self, seed: int | None, options: dict[str, Any] | None
    ) -> tuple[list[Message], dict[str, Any]]:
        self._in_episode, self._turn = False, 0
        data = dict(options or {})
        if seed is not None:
            data["seed"] = seed
        try:
            result = await self._call("reset", data)
        except RemoteEnvUnavailableError:
            await self._disconnect()  # the old session went with its connection: start afresh
            result = await self._call("reset", data)
        self._in_episode = True
        head = [system(self.system_prompt)] if self.system_prompt else []
        return [*head, user(self._text(result.observation))], {"observation": result.observation}

    async def _step(self, action: Action) -> StepResult:
        if not self._in_episode:
            raise EnvhubError(f"{self.name}: call reset() before step() (or after an episode ends)")
        text = as_turn(action).message.content or ""
        result = await self._call("step", {**self.action_defaults, self.action_field: text})
        self._turn += 1
        terminated = bool(result.done)
        truncated = not terminated and self.max_turns is not None and self._turn >= self.max_turns
        self._in_episode = not (terminated or truncated)
        reward = 0.0 if result.reward is None else float(result.reward)
        info: dict[str, Any] = {"observation": result.observation, "turn": self._turn}
        return [user(self._text(result.observation))], reward, terminated, truncated, info

    async def _call(self, op: str, data: dict[str, Any]) -> Any:
        """Reset or step through OpenEnv's client, its failures turned into envhub's."""
        from websockets.exceptions import WebSocketException

        client = await self._connected()
        try:
            if op == "reset":
                return await client.reset(**data)
            return await client.step(data)
        except RuntimeError as e:
            if not str(e).startswith("Server error"):
                raise
            raise RemoteEnvError(f"{self.name} at {self.url}: {e}", remote_type=op) from e
        except (OSError, WebSocketException, asyncio.TimeoutError) as e:
            await self._disconnect()
            where = "mid-episode; this episode cannot go on" if self._in_episode else "on reset"
            self._in_episode = False
            raise RemoteEnvUnavailableError(
                f"{self.name} at {self.url}: the OpenEnv session was lost {where} "
                f"({type(e).__name__}: {e or 'no answer in time'})"
            ) from e

    async def _connected(self) -> Any:
        if self._client is None:
            from openenv.core import GenericEnvClient

            client = GenericEnvClient(
                base_url=self.url, connect_timeout_s=self.timeout, message_timeout_s=self.timeout
            )
            try:
                await client.connect()
            except ConnectionError as e:
                raise RemoteEnvUnavailableError(
                    f"cannot reach the OpenEnv server at {self.url} ({e})"
                ) from e
            self._client = client
        return self._client

    async def _disconnect(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.disconnect()  # best effort: it swallows its own errors

    def _text(self, observation: dict[str, Any]) -> str:
        value = observation.get(self.observation_field)
        return value if isinstance(value, str) else "" if value is None else str(value)

    def _fetch(self, path: str) -> dict[str, Any]:
        import httpx

        try:
            response = httpx.get(self.http_url + path, timeout=self.timeout)
        except httpx.TransportError as e:
            raise RemoteEnvUnavailableError(
                f"cannot reach the OpenEnv server at {self.url} ({type(e).__name__}: {e}); "
                "is it running?"
            ) from e
        if response.status_code != 200:
            raise EnvLoadError(
                f"{self.url}{path} answered {response.status_code}: is this an OpenEnv server?"
            )
        return response.json()


def _http_url(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    return {"ws": "http", "wss": "https"}.get(scheme, scheme) + sep + rest


def _fields(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in (schema.get("properties") or {}).items() if k not in RESERVED}


def _is_text(spec: dict[str, Any]) -> bool:
    """A string field (also ``str | None``, written ``anyOf`` in the JSON schema)."""
    if spec.get("type") == "string":
        return True
    return any(option.get("type") == "string" for option in spec.get("anyOf", ()))


def _text_field(schema: dict[str, Any], chosen: str | None, kind: str) -> str:
    """The field of ``schema`` that carries text: ``chosen``, the only string field, or the
    first of :data:`TEXT_FIELDS` among the string fields."""
    fields = _fields(schema)
    option = f"{kind}_field"
    if chosen is not None:
        if chosen not in fields:
            raise EnvLoadError(f"the OpenEnv {kind} has no field {chosen!r}; it has {list(fields)}")
        return chosen
    texts = [name for name, spec in fields.items() if _is_text(spec)]
    if len(texts) == 1:
        return texts[0]
    for name in TEXT_FIELDS:
        if name in texts:
            return name
    if not texts:
        raise EnvLoadError(
            f"the OpenEnv {kind} ({schema.get('title', kind)}: {list(fields)}) has no string "
            f"field to carry text; the adapter fits text-in/text-out envs only"
        )
    raise EnvLoadError(
        f"the OpenEnv {kind} has several string fields {texts}; pick one with {option}=NAME"
    )


def _check_action_fillable(schema: dict[str, Any], field: str, defaults: dict[str, Any]) -> None:
    missing = [n for n in schema.get("required", ()) if n != field and n not in defaults]
    if missing:
        raise EnvLoadError(
            f"the OpenEnv action {schema.get('title', '')} needs {missing} besides the text "
            f"field {field!r}; give them with action_defaults={{...}}"
        )
