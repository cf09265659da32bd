"""The OpenEnv adapter's env: one server session per env, driven through OpenEnv's
``GenericEnvClient`` on envhub's I/O loop (see the package docstring for the mapping)."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import replace
from typing import Any

from envhub.adapters.openenv import schema as schemas
from envhub.adapters.openenv.actions import Attempt, MCPActions, TextActions, TypedActions
from envhub.adapters.openenv.validation import ServerError, blames_action, client_class
from envhub.env import Action, Env, StepResult, as_turn
from envhub.errors import (
    EnvhubError,
    EnvLoadError,
    RemoteEnvError,
    RemoteEnvUnavailableError,
)
from envhub.tools.executor import INVALID_ARGUMENTS
from envhub.types import Message, system, user

NOT_RUN = "not_run"
"""A call after one that ended the episode, in the same turn: answered, not sent, not counted."""


class _Rejected(Exception):
    """The server refused an action as invalid (OpenEnv's ``VALIDATION_ERROR`` about the
    action): the policy's."""


def _summary(errors: list[dict[str, object]] | None) -> str:
    """Pydantic's errors in one line: ``loc: msg`` each."""
    return "; ".join(
        f"{'.'.join(map(str, e.get('loc', ()))) or 'the model'}: {e.get('msg', '?')}"
        for e in errors or ()
    )


class OpenEnvEnv(Env):
    """An env on an OpenEnv server, driven through OpenEnv's ``GenericEnvClient``.

    Args:
        url: The server's base URL (``http://HOST:PORT``; ``ws://`` works too).
        action_mode: ``auto``, ``text``, ``tool`` or ``mcp`` (see the package docstring).
        action_field: The action field the model's text goes into (text mode; default: found
            from the server's ``/schema``). Naming it asks for text mode.
        observation_field: The observation field shown to the model (default: found the same
            way; none found: the observation's fields as JSON).
        action_defaults: Values for the action's other fields, sent with every step.
        tool_name: The name of a typed action's tool (default: from the action's class).
        invalid_reward: The reward of a turn that makes no valid action.
        system_prompt: A system message put before the reset observation.
        max_turns: Turns after which an episode that is not done is truncated (``None``: none).
        timeout: Seconds to wait for the server's answer to each call.
        reward_range: Bounds of an episode's total reward, if the env has known ones.

    Raises:
        RemoteEnvUnavailableError: Nothing answers at ``url``.
        EnvLoadError: The action cannot be mapped in the mode asked for.
    """

    def __init__(
        self,
        url: str,
        *,
        action_mode: str = "auto",
        action_field: str | None = None,
        observation_field: str | None = None,
        action_defaults: dict[str, Any] | None = None,
        tool_name: str | None = None,
        invalid_reward: float = 0.0,
        system_prompt: str | None = None,
        max_turns: int | None = 32,
        timeout: float = 60.0,
        reward_range: tuple[float, float] | None = None,
    ) -> None:
        super().__init__()
        self.url = url.rstrip("/")
        self.http_url = _http_url(self.url)
        self.timeout, self.max_turns, self.system_prompt = timeout, max_turns, system_prompt
        self.invalid_reward = float(invalid_reward)
        self.action_defaults = dict(action_defaults or {})
        if reward_range is not None:
            self.reward_range = (float(reward_range[0]), float(reward_range[1]))
        schema, described = self._fetch("/schema"), self._fetch("/metadata")
        self.name = f"openenv:{described.get('name') or 'env'}"
        self.version = described.get("version") or "0.0.0"
        action = schema["action"]
        self.action_field = schemas.text_field(action, action_field, "action")
        if action_field is not None and action_mode == "auto":
            action_mode = "text"
        self.action_mode = schemas.choose_mode(
            action, action_mode, self.action_field, self.action_defaults
        )
        if self.action_mode == "mcp" and observation_field is None:
            self.observation_field = None  # a call's reply is its result, not a field
        else:
            self.observation_field = schemas.text_field(
                schema["observation"], observation_field, "observation"
            )
        self.actions = self._actions(action, tool_name)
        self._client: Any = None
        self._turn = 0
        self._in_episode = False
        self._metrics: Counter[str] = Counter()

    @property
    def tool_schemas(self) -> list[dict[str, Any]] | None:
        """The tools of the tool and mcp modes (``None`` in text mode)."""
        return self.actions.tool_schemas

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
        """Send the turn as actions; see the package docstring for the mapping."""
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
        self._in_episode, self._turn, self._metrics = False, 0, Counter()
        data = dict(options or {})
        if seed is not None:
            data["seed"] = seed
        try:
            result = await self._call("reset", data)
        except RemoteEnvUnavailableError:
            await self._disconnect()  # the old session went with its connection: start afresh
            result = await self._call("reset", data)
        self._in_episode = True
        text = schemas.observation_text(result.observation, self.observation_field)
        if not text and self.tool_schemas:
            names = ", ".join(t["function"]["name"] for t in self.tool_schemas)
            text = f"The environment is ready. Act by calling its tools: {names}."
        head = [system(self.system_prompt)] if self.system_prompt else []
        return [*head, user(text)], {"observation": result.observation}

    async def _step(self, action: Action) -> StepResult:
        if not self._in_episode:
            raise EnvhubError(f"{self.name}: call reset() before step()")
        attempts = self.actions.plan(as_turn(action), self._turn)
        if self.action_mode != "text":
            self._metrics["tool_calls"] += sum(a.call_id is not None for a in attempts)
        replies: list[Message] = []
        reward, terminated, stepped, observation = 0.0, False, 0, None
        for attempt in attempts:
            message, result = await self._send(attempt, ended=terminated)
            replies.append(message)
            if result is not None:
                stepped += 1
                observation = result.observation
                reward += 0.0 if result.reward is None else float(result.reward)
                terminated = bool(result.done)
        if stepped == 0:
            self._metrics["invalid_turns"] += 1
            reward += self.invalid_reward
        self._turn += 1
        truncated = not terminated and self.max_turns is not None and self._turn >= self.max_turns
        info: dict[str, Any] = {
            "observation": observation,
            "turn": self._turn,
            "metrics": dict(self._metrics),
        }
        return replies, reward, terminated, truncated, info

    async def _send(self, attempt: Attempt, ended: bool) -> tuple[Message, Any]:
        """Step the server with one attempt's action (unless it is a failed one, or an earlier
        call of the turn ``ended`` the episode); the message answering it, and the step's
        result (``None``: nothing was sent, or the server rejected the action)."""
        if attempt.error is None and ended:
            attempt = replace(attempt, error=NOT_RUN, detail="not run: the episode ended")
        if attempt.error is None:
            try:
                result = await self._call("step", attempt.action or {})
            except _Rejected as e:
                attempt = replace(attempt, error=INVALID_ARGUMENTS, detail=str(e))
            else:
                message, kind = self.actions.reply(attempt, result.observation)
                self._count(kind)
                return message, result
        self._count(attempt.error if attempt.call_id is not None else None)
        return attempt.answer(f"Error: {attempt.detail}"), None

    def _count(self, kind: str | None) -> None:
        """Count a failed call of ``kind`` in the episode's metrics (``None``: none failed)."""
        if kind is not None and kind != NOT_RUN:
            self._metrics["tool_errors"] += 1
            self._metrics[f"tool_error/{kind}"] += 1

    async def _call(self, op: str, data: dict[str, Any]) -> Any:
        """Reset or step through OpenEnv's client, its failures turned into envhub's."""
        from websockets.exceptions import WebSocketException

        client = await self._connected()
        try:
            if op == "reset":
                return await client.reset(**data)
            return await client.step(data)
        except ServerError as e:
            if op == "step" and e.code == "VALIDATION_ERROR":
                if blames_action(e.errors, data):
                    raise _Rejected(f"the env rejected the action as invalid: {data}") from e
                raise RemoteEnvError(
                    f"{self.name} at {self.url}: the env's own step failed a validation that "
                    f"is not about the action ({_summary(e.errors)}): a bug in the env",
                    remote_type="ValidationError",
                ) from e
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
            client = client_class()(
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

    def _actions(self, action: dict[str, Any], tool_name: str | None) -> Any:
        """The mapper of the chosen mode."""
        if self.action_mode == "text":
            assert self.action_field is not None  # choose_mode checked it
            return TextActions(self.action_field, self.observation_field, self.action_defaults)
        if self.action_mode == "mcp":
            return MCPActions(self._mcp_tools())
        title = action.get("title", "action")
        return TypedActions(
            tool_name or schemas.tool_name(action),
            action.get("description") or f"Act in {self.name}: send one {title}.",
            schemas.action_parameters(action, self.action_defaults),
            self.observation_field,
            self.action_defaults,
        )

    def _mcp_tools(self) -> dict[str, tuple[str, dict[str, Any]]]:
        """The server's MCP tools (its ``/mcp`` ``tools/list``): name -> (description, schema)."""
        answer = self._fetch("/mcp", {"jsonrpc": "2.0", "method": "tools/list", "id": 1})
        listed = (answer.get("result") or {}).get("tools")
        if not isinstance(listed, list) or not listed:
            raise EnvLoadError(
                f"{self.url}/mcp listed no tools ({answer.get('error') or answer}): an MCP env "
                "needs at least one"
            )
        empty = {"type": "object", "properties": {}}
        return {
            t["name"]: (t.get("description") or "", t.get("input_schema") or empty) for t in listed
        }

    def _fetch(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        import httpx

        try:
            if body is None:
                response = httpx.get(self.http_url + path, timeout=self.timeout)
            else:
                response = httpx.post(self.http_url + path, json=body, timeout=self.timeout)
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
