"""MCP tools: the tools of a Model Context Protocol server become tools of a ``ToolEnv``.

    server = MCPTools.stdio("python", ["my_server.py"])   # or MCPTools.http(url, headers=...)
    env = MCPToolEnv(dataset, server=server)               # one MCP session per env instance

Schemas are the server's own (each tool's ``inputSchema``). Arguments are checked against them
before a call is sent, and calls run through the env's :class:`~envhub.tools.ToolExecutor` like
any tool's, with its timeouts and error kinds:

- a result's text blocks are joined by newlines; other blocks (image, audio, resources) are
  described in a line each; ``structuredContent`` is sent as JSON when there are no blocks;
- a result with ``isError`` is the ``tool_error`` kind (the model reads the server's text);
- a call that outlives its timeout is the ``timeout`` kind, and the request is cancelled;
- a server that cannot be reached or is gone (exited, killed, connection refused) raises
  :class:`~envhub.errors.ToolServerUnavailableError`, a ``ConnectionError``: the step fails and
  the rollout runner records an infrastructure failure, not a reward of 0.

The MCP client is async, and its session belongs to the task that opened it; an env's
coroutines run on whatever loop drives them (the runner's, or the private loop behind
``step``). So a connection keeps its session on a thread of its own, with its own event loop,
and calls reach it through ``run_coroutine_threadsafe``: awaiting a call never blocks the
caller's loop, and cancelling it cancels the request. Needs the MCP SDK 2.x (``pip install
'envhub[mcp]'``), which is imported only when a connection opens.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import re
import shlex
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import jsonschema
from pydantic import BaseModel, ConfigDict

from envhub._async import run_sync
from envhub.errors import (
    ConfigError,
    EnvhubError,
    MissingDependencyError,
    ToolArgumentError,
    ToolDefinitionError,
    ToolServerUnavailableError,
)
from envhub.multiturn import ToolEnv
from envhub.tools.tool import TOOL_NAME_PATTERN, Tool
from envhub.types import Message

__all__ = ["MCPConnection", "MCPTool", "MCPToolEnv", "MCPToolError", "MCPTools"]

_CLOSE_TIMEOUT = 10.0
"""Seconds to wait for a session to end (the SDK's stdio shutdown is bounded at about 6 s)."""


class MCPToolError(Exception):
    """The server answered a call with ``isError``; the executor reports it as ``tool_error``."""


@dataclass(frozen=True)
class MCPTools:
    """Where an MCP server is and how to reach it; :meth:`connect` opens a session to it.

    Make one with :meth:`stdio` or :meth:`http`. It holds no connection, so one spec serves
    many envs, each with its own session.
    """

    transport: Literal["stdio", "http"]
    target: str
    """The command that starts the server (stdio), or its endpoint URL (http)."""
    args: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    """Variables for a stdio server, over the SDK's safe defaults (``PATH``, ``HOME``, ...)."""
    cwd: str | None = None
    headers: Mapping[str, str] | None = None
    timeout: float | None = None
    """Seconds each call may take; ``None``: the env's ``tool_timeout``."""
    connect_timeout: float = 30.0
    """Seconds to start the server (stdio), connect, and list its tools."""

    @classmethod
    def stdio(
        cls,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        connect_timeout: float = 30.0,
    ) -> MCPTools:
        """A server started as a subprocess, spoken to over its stdin and stdout.

        Args:
            command: The executable, e.g. ``"python"`` or ``"npx"``.
            args: Its arguments.
            env: Extra environment variables for it.
            cwd: Its working directory.
            timeout: Seconds per call (``None``: the env's ``tool_timeout``).
            connect_timeout: Seconds to start it and list its tools.
        """
        return cls(
            "stdio",
            command,
            args=tuple(args),
            env=env,
            cwd=cwd,
            timeout=timeout,
            connect_timeout=connect_timeout,
        )

    @classmethod
    def http(
        cls,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        connect_timeout: float = 30.0,
    ) -> MCPTools:
        """A running server reached over streamable HTTP.

        Args:
            url: Its endpoint, e.g. ``"http://127.0.0.1:8000/mcp"``.
            headers: Sent with every request (e.g. ``{"Authorization": "Bearer ..."}``).
            timeout: Seconds per call (``None``: the env's ``tool_timeout``).
            connect_timeout: Seconds to connect and list its tools.
        """
        return cls("http", url, headers=headers, timeout=timeout, connect_timeout=connect_timeout)

    def __str__(self) -> str:
        if self.transport == "stdio":
            return f"MCP server `{shlex.join([self.target, *self.args])}`"
        return f"MCP server at {self.target}"

    def connect(self) -> MCPConnection:
        """Open a session and list the server's tools (blocks until then).

        Raises:
            ToolServerUnavailableError: The server could not be started or reached in time.
        """
        connection = MCPConnection(self)
        connection.start()
        return connection

    async def aconnect(self) -> MCPConnection:
        """Async form of :meth:`connect`; the caller's loop runs on while it connects."""
        connection = MCPConnection(self)
        await connection.astart()
        return connection

    async def _open(self, stack: contextlib.AsyncExitStack) -> Any:
        """Connect, entering what must be closed into ``stack``; return the ``mcp.Client``."""
        try:
            from mcp import Client, StdioServerParameters
            from mcp.client.stdio import stdio_client
            from mcp.client.streamable_http import streamable_http_client
        except ImportError as e:
            raise MissingDependencyError(
                f"MCP tools need the MCP SDK 2.x ({e}); run `pip install 'envhub[mcp]'`"
            ) from e
        if self.transport == "stdio":
            params = StdioServerParameters(
                command=self.target,
                args=list(self.args),
                env=dict(self.env) if self.env is not None else None,
                cwd=self.cwd,
            )
            transport = stdio_client(params)
        else:
            import httpx2  # the SDK's HTTP client (a dependency of mcp 2)

            # The SDK's own default timeouts: a server may hold a response stream open.
            http = await stack.enter_async_context(
                httpx2.AsyncClient(
                    headers=dict(self.headers or {}), timeout=httpx2.Timeout(30.0, read=300.0)
                )
            )
            transport = streamable_http_client(self.target, http_client=http)
        return await stack.enter_async_context(Client(transport, cache=None))


class MCPConnection:
    """A live session with an MCP server, held on a thread of its own; its :attr:`tools` call it.

    Made by :meth:`MCPTools.connect`. Close it (or use it in ``with``) to end the session, and
    with it a stdio server's process; closing is idempotent.
    """

    def __init__(self, server: MCPTools) -> None:
        self.server = server
        self.tools: list[Tool] = []
        """The server's tools, as envhub tools (filled when the session opens)."""
        self._client: Any = None
        self._lost: str | None = None
        self._closed = False
        self._session: concurrent.futures.Future[None] | None = None
        self._stop = asyncio.Event()  # bound to the connection's loop on first use (3.10+)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"envhub-mcp:{server.target}", daemon=True
        )
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Whether the session is open and the server has not been lost."""
        return self._client is not None and self._lost is None and not self._closed

    def start(self) -> None:
        """Open the session and list the tools; see :meth:`MCPTools.connect`."""
        ready = self._begin()
        try:
            ready.result(timeout=self.server.connect_timeout)
        except BaseException as e:
            self.close()
            if not isinstance(e, Exception):  # Ctrl-C
                raise
            raise self._connect_error(e) from e

    async def astart(self) -> None:
        """Async form of :meth:`start`."""
        ready = asyncio.wrap_future(self._begin())
        try:
            done, _ = await asyncio.wait({ready}, timeout=self.server.connect_timeout)
            if not done:
                raise TimeoutError(f"no session within {self.server.connect_timeout:g} s")
            ready.result()
        except BaseException as e:
            ready.cancel()
            await asyncio.to_thread(self.close)
            if not isinstance(e, Exception):  # the caller was cancelled
                raise
            raise self._connect_error(e) from e

    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        """Call the server's tool ``name``; return its ``CallToolResult``.

        Awaitable from any event loop. Cancelling it cancels the request.

        Raises:
            ToolServerUnavailableError: The session is closed or the server is gone.
        """
        if self._closed:
            raise ToolServerUnavailableError(f"{self.server}: the connection is closed")
        future = asyncio.run_coroutine_threadsafe(self._call(name, arguments), self._loop)
        return await asyncio.wrap_future(future)

    def close(self) -> None:
        """End the session (a stdio server's process with it) and the connection's thread."""
        if self._closed:
            return
        self._closed = True
        if self._session is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            try:
                self._session.result(timeout=_CLOSE_TIMEOUT)
            except BaseException:  # it failed or hangs: what is left is cancelled below
                self._session.cancel()
        cleanup = asyncio.run_coroutine_threadsafe(_cancel_other_tasks(), self._loop)
        try:
            cleanup.result(timeout=_CLOSE_TIMEOUT)
        except BaseException:
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=_CLOSE_TIMEOUT)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> MCPConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- on the connection's own loop ---------------------------------------------------------

    def _begin(self) -> concurrent.futures.Future[None]:
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._session = asyncio.run_coroutine_threadsafe(self._hold(ready), self._loop)
        return ready

    async def _hold(self, ready: concurrent.futures.Future[None]) -> None:
        """Open the session, list the tools, and keep the session until ``close``."""
        try:
            async with contextlib.AsyncExitStack() as stack:
                client = await self.server._open(stack)
                listing = await _list_tools(client)
                self.tools = _make_tools(listing, self)
                self._client = client
                ready.set_result(None)
                await self._stop.wait()
        except Exception as e:  # the transport failed (at the start, or later: HTTP)
            self._lose(e)
            if not ready.done():
                ready.set_exception(e)
        finally:
            self._client = None
            if not ready.done():
                ready.cancel()

    async def _call(self, name: str, arguments: dict[str, Any]) -> Any:
        client = self._client
        if client is None or self._lost is not None:
            raise ToolServerUnavailableError(f"{self.server} is gone ({self._lost or 'closed'})")
        try:
            return await client.call_tool(name, arguments)
        except Exception as e:
            if not _is_connection_loss(e):
                raise
            self._lose(e)
            raise ToolServerUnavailableError(f"{self.server} is gone ({self._lost})") from e

    def _lose(self, error: BaseException) -> None:
        if self._lost is None:
            self._lost = _describe(error)

    def _connect_error(self, error: BaseException) -> Exception:
        if isinstance(error, (MissingDependencyError, ToolDefinitionError)):
            return error
        if isinstance(error, (TimeoutError, concurrent.futures.TimeoutError)):
            reason = f"no answer within {self.server.connect_timeout:g} s"
        else:
            reason = _describe(error)
        return ToolServerUnavailableError(f"cannot connect to {self.server}: {reason}")


async def _cancel_other_tasks() -> None:
    """Cancel the calls still running on a connection's loop, so that it can close cleanly."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _list_tools(client: Any) -> list[Any]:
    tools, cursor = [], None
    while True:
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools


def _is_connection_loss(error: BaseException) -> bool:
    from mcp import MCPError
    from mcp_types import CONNECTION_CLOSED

    if isinstance(error, MCPError):
        return error.code == CONNECTION_CLOSED
    if isinstance(error, (ConnectionError, EOFError)):
        return True
    package = type(error).__module__.split(".")[0]
    return package in {"anyio", "httpx2", "httpcore2", "httpx", "httpcore"}


def _describe(error: BaseException) -> str:
    """``Type: message`` of an error, or of the errors inside an exception group."""
    inner = getattr(error, "exceptions", None)  # an exception group (a backport's on 3.10)
    if isinstance(inner, tuple) and inner:
        return "; ".join(_describe(e) for e in inner)
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


# -- tools ----------------------------------------------------------------------------------


class _AnyArguments(BaseModel):
    """Placeholder for :attr:`Tool.arguments_model`: MCP tools check a JSON schema instead."""

    model_config = ConfigDict(extra="allow")


@dataclass(frozen=True)
class MCPTool(Tool):
    """A tool served by an MCP server: checked against the server's schema, run by the server."""

    remote_name: str = ""
    """The server's name for it (``name`` is the same, or made OpenAI-safe)."""
    connection: MCPConnection | None = field(default=None, repr=False, compare=False)

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Check the model's arguments against the server's ``inputSchema``."""
        if not isinstance(arguments, dict):
            raise ToolArgumentError(
                f"arguments must be a JSON object, got {type(arguments).__name__}"
            )
        problems = schema_problems(self.parameters, arguments)
        if problems:
            raise ToolArgumentError(f"invalid arguments for {self.name}: " + "; ".join(problems))
        return arguments

    async def ainvoke(
        self, validated: dict[str, Any], context: dict[str, Any] | None = None
    ) -> Any:
        """Call the server; return the result's text.

        Raises:
            MCPToolError: The server reported the call as failed (``isError``).
            ToolServerUnavailableError: The server is gone.
        """
        assert self.connection is not None, "an MCPTool is made by MCPConnection"
        result = await self.connection.call(self.remote_name, validated)
        text = result_text(result)
        if result.is_error:
            raise MCPToolError(text or "the server reported an error")
        return text

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the tool from sync code: ``tool(a=1, b=2)`` returns the result's text."""
        if args:
            raise TypeError(f"{self.name}: pass MCP tool arguments by name")
        return run_sync(self.ainvoke(self.validate(kwargs)))


def result_text(result: Any) -> str:
    """The text a ``CallToolResult`` shows the model: text blocks joined by newlines, other
    blocks described in a line each, or the structured content as JSON when there are none."""
    if not result.content and result.structured_content is not None:
        return json.dumps(result.structured_content)
    return "\n".join(_block_text(block) for block in result.content)


def _block_text(block: Any) -> str:
    kind = getattr(block, "type", type(block).__name__)
    if kind == "text":
        return block.text
    if kind in ("image", "audio"):
        size = len(block.data) * 3 // 4 - block.data[-2:].count("=")  # base64's decoded size
        return f"[{kind}: {block.mime_type}, {size} bytes]"
    if kind == "resource_link":
        return f"[resource link: {block.name} <{block.uri}>]"
    if kind == "resource":
        resource = block.resource
        if getattr(resource, "text", None) is not None:
            return resource.text
        return f"[resource: {resource.uri}, {resource.mime_type or 'binary'}]"
    return f"[{kind} content]"


def schema_problems(schema: dict[str, Any], arguments: dict[str, Any]) -> list[str]:
    """What is wrong with ``arguments`` under the JSON ``schema``, one line each for the model
    (empty: nothing, or the schema itself is broken and the server must judge)."""
    try:
        validator = jsonschema.validators.validator_for(schema)(schema)
        errors = sorted(validator.iter_errors(arguments), key=lambda e: list(map(str, e.path)))
    except jsonschema.SchemaError:  # the server's schema is broken: let the server judge
        return []
    problems = []
    for error in errors:
        where = ".".join(map(str, error.path))
        if error.validator == "required" and not where:
            missing = sorted(set(error.validator_value) - set(arguments))
            problems += [f"missing required argument {name!r}" for name in missing]
        elif error.validator == "additionalProperties" and not where:
            extra = sorted(set(arguments) - set(schema.get("properties", {})))
            problems += [f"unexpected argument {name!r}" for name in extra]
        else:
            problems.append(f"argument {where or 'arguments'!r}: {error.message}")
    return problems


def _make_tools(listing: list[Any], connection: MCPConnection) -> list[Tool]:
    tools: dict[str, Tool] = {}
    for remote in listing:
        name = _openai_name(remote.name)
        if name in tools:
            raise ToolDefinitionError(
                f"{connection.server}: tools {tools[name].remote_name!r} and {remote.name!r} "
                f"both become {name!r}"
            )
        tools[name] = MCPTool(
            name=name,
            description=remote.description or remote.title or remote.name,
            parameters=remote.input_schema,
            fn=connection.call,
            arguments_model=_AnyArguments,
            injected={},
            timeout=connection.server.timeout,
            remote_name=remote.name,
            connection=connection,
        )
    return list(tools.values())


def _openai_name(name: str) -> str:
    """MCP allows names (``files/read``, ``a.b``) that OpenAI's API does not: map those."""
    if TOOL_NAME_PATTERN.fullmatch(name):
        return name
    return re.sub(r"[^a-zA-Z0-9_-]", "_", name)[:64] or "tool"


# -- the env --------------------------------------------------------------------------------


class MCPToolEnv(ToolEnv):
    """A :class:`~envhub.multiturn.ToolEnv` whose tools come from an MCP server.

    Each instance holds one session, opened on its first reset (or first look at
    ``tool_schemas``) and closed by ``close()``; a reset after the server was lost opens a new
    one. Local ``tools`` may be added beside the server's. Subclasses may set ``server`` on the
    class, like ``tools``::

        class Files(MCPToolEnv):
            server = MCPTools.stdio("npx", ["-y", "@modelcontextprotocol/server-filesystem", "."])

    Args:
        server: The MCP server; defaults to the class's ``server``.
        **kwargs: See :class:`~envhub.multiturn.ToolEnv` (dataset, rubric, tool_timeout, ...).
    """

    name = "mcp"
    server: ClassVar[MCPTools | None] = None

    def __init__(self, *args: Any, server: MCPTools | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        spec = server if server is not None else type(self).server
        if spec is None:
            raise ConfigError(
                f"{self.name}: pass `server=MCPTools.stdio(...)` or `MCPTools.http(...)`, "
                "or set `server` on the class"
            )
        self.mcp_server: MCPTools = spec
        self.connection: MCPConnection | None = None
        self._local_tools = dict(self.toolset)

    @property
    def tool_schemas(self) -> list[dict[str, Any]] | None:
        """The tools' schemas; looked at before the first reset, they open the session."""
        if not self._closed and self.connection is None:
            self._install(self.mcp_server.connect())
        return super().tool_schemas

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Open the session if there is none (or the server was lost), then start an episode.

        Raises:
            ToolServerUnavailableError: The server cannot be started or reached.
        """
        if self._closed:
            raise EnvhubError(f"{self.name}: the env is closed")
        if self.connection is None or not self.connection.alive:
            if self.connection is not None:
                await asyncio.to_thread(self.connection.close)
                self.connection = None
            self._install(await self.mcp_server.aconnect())
        return await super().areset(seed=seed, options=options)

    def on_close(self) -> None:
        """End the MCP session (and a stdio server's process)."""
        if self.connection is not None:
            self.connection.close()
            self.connection = None

    def _install(self, connection: MCPConnection) -> None:
        clash = sorted({t.name for t in connection.tools} & set(self._local_tools))
        if clash:
            connection.close()
            raise ToolDefinitionError(
                f"{self.name}: {connection.server} has tools named like local ones: {clash}"
            )
        self.connection = connection
        self.toolset = {**self._local_tools, **{t.name: t for t in connection.tools}}
        self.executor.tools = dict(self.toolset)
