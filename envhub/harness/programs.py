"""Agent programs a harness env runs: a Python callable, or a command in a subprocess.

A program gets the episode's OpenAI-compatible ``base_url`` and key and the task, runs its own
loop against that endpoint, and returns a result. How it ended is reported as a
:class:`ProgramError` of a kind the env records: ``start`` (it could not start), ``crash`` (it
raised), ``exit`` (a command exited non-zero), or ``policy`` (it gave up because of what the
policy wrote: see :data:`POLICY_EXCEPTIONS` and :class:`PolicyFailure`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import shlex
import signal
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from envhub.harness.launch import STDERR_TAIL, Launch, ProgramError, ProgramResult
from envhub.harness.sandboxed import run_in_session
from envhub.lifetime import guarded
from envhub.lifetime.procs import CANNOT_START, CANNOT_START_CODE

MAX_OUTPUT_BYTES = 1024 * 1024
"""A command's stdout kept as its result (the rest is dropped, and that is said)."""
LEFTOVER_GRACE_S = 1.0
"""How long what a command left running gets between SIGTERM and SIGKILL once it exits."""


class PolicyFailure(Exception):  # noqa: N818 - named for what it records, like the outcome
    """Raise it from a program to end the episode as the policy's failure (the policy wrote
    something the program cannot go on from): the episode is scored and trained on, where any
    other exception marks it as the program's own failure and keeps it out of the loss."""


POLICY_EXCEPTIONS = frozenset(
    {
        "PolicyFailure",
        "ModelBehaviorError",  # OpenAI Agents SDK: a call to an unknown tool, bad JSON, ...
        "MaxTurnsExceeded",  # OpenAI Agents SDK: the agent never finished
        "UnexpectedModelBehavior",  # pydantic-ai
        "UsageLimitExceeded",  # pydantic-ai
        "AgentParsingError",  # smolagents
        "AgentMaxStepsError",  # smolagents
    }
)
"""Names of exception classes that agent frameworks raise because of what the model wrote;
a program that raises one (or a subclass) failed because of the policy."""


def blames_policy(error: BaseException) -> bool:
    """Whether ``error`` is a framework's way of saying the model's turn was unusable."""
    return any(cls.__name__ in POLICY_EXCEPTIONS for cls in type(error).__mro__)


class Program(Protocol):
    """Anything a harness env can run per episode."""

    async def run(self, launch: Launch) -> ProgramResult:
        """Run on one task to the end; raise :class:`ProgramError` when it fails."""
        ...

    def describe(self) -> str:
        """One line for logs and errors."""
        ...


ARGUMENTS = ("client", "base_url", "api_key", "task", "prompt", "model", "session")
"""The parameters a callable program may declare, filled by name."""


@dataclass
class CallableProgram:
    """A Python function as a program; its parameters are filled by name from :data:`ARGUMENTS`.

    ``client`` is a ready ``openai`` client pointed at the episode (``AsyncOpenAI`` for an async
    function, ``OpenAI`` for a sync one, which runs in a worker thread); ``prompt`` is the task as
    text, ``task`` the whole row. The return value is the episode's result.
    """

    fn: Callable[..., Any]
    max_retries: int = 0
    """Passed to the ``openai`` client: a retry would re-send a call the policy answered."""

    def __post_init__(self) -> None:
        params = inspect.signature(self.fn).parameters
        unknown = [
            name
            for name, p in params.items()
            if name not in ARGUMENTS
            and p.default is inspect.Parameter.empty
            and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
        ]
        if unknown:
            raise TypeError(
                f"{self.describe()}: parameters {unknown} cannot be filled; "
                f"a program may take {', '.join(ARGUMENTS)}"
            )
        self._params = [name for name in params if name in ARGUMENTS]
        self._async = inspect.iscoroutinefunction(self.fn)

    def describe(self) -> str:
        """The function's qualified name."""
        return f"{getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', self.fn)}"

    async def run(self, launch: Launch) -> ProgramResult:
        """Call the function (in a worker thread when it is sync)."""
        try:
            if self._async:
                # The client is cheap (its connection pool is the loop's, shared) and has
                # nothing of its own to close.
                kwargs, _ = self._arguments(launch, asynchronous=True)
                return ProgramResult(await self.fn(**kwargs))
            kwargs, client = self._arguments(launch, asynchronous=False)
            try:
                return ProgramResult(await asyncio.to_thread(self.fn, **kwargs))
            finally:
                if client is not None:
                    client.close()
        except (asyncio.CancelledError, ProgramError):
            raise
        except Exception as e:
            kind = "policy" if blames_policy(e) else "crash"
            raise ProgramError(kind, f"{type(e).__name__}: {e}") from e

    def _arguments(self, launch: Launch, asynchronous: bool) -> tuple[dict[str, Any], Any]:
        values: dict[str, Any] = {
            "base_url": launch.base_url,
            "api_key": launch.api_key,
            "task": launch.task,
            "prompt": launch.prompt,
            "model": launch.model,
            "session": launch.session,
        }
        client = None
        if "client" in self._params:
            import openai

            make = openai.AsyncOpenAI if asynchronous else openai.OpenAI
            client = make(
                base_url=launch.base_url,
                api_key=launch.api_key,
                max_retries=self.max_retries,
                timeout=launch.timeout,  # the env's deadline is the one that counts
                http_client=_loop_pool() if asynchronous else _own_pool(),
            )
            values["client"] = client
        return {name: values[name] for name in self._params}, client


_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()


def _loop_pool() -> Any:
    """The running loop's HTTP connection pool for ``AsyncOpenAI`` clients, made on first use.

    A pool of its own per client cost ~4 ms of CPU per episode (its TLS context, even unused)
    and a new connection; the endpoint's key is in each request's path and header, so clients
    of different episodes can share one. Closing it is a no-op: a program that closes its
    client (``async with client:``) must not close the others' connections.
    """
    loop = asyncio.get_running_loop()
    if loop not in _pools:
        import openai

        class SharedPool(openai.DefaultAsyncHttpxClient):  # type: ignore[misc, valid-type]
            async def aclose(self) -> None:
                """Kept open: other episodes' clients use it."""

        # plain http to 127.0.0.1: no CA bundle to parse (27 ms of CPU with the default)
        _pools[loop] = SharedPool(verify=False)
    return _pools[loop]


def _own_pool() -> Any:
    """An HTTP pool for one sync ``OpenAI`` client (it runs in a worker thread of its own)."""
    import openai

    return openai.DefaultHttpxClient(verify=False)


@dataclass
class CommandProgram:
    """A command as a program: ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and ``OPENAI_MODEL`` in
    its environment, the task's text on stdin (``task_input="stdin"``) or as its last argument
    (``"argument"``); its stdout (stripped) is the result and a non-zero exit a failure. It runs
    in its own process group, which is killed when the episode ends, however it ends; in the
    episode's sandbox session when the env has a sandbox (then with the sandbox's environment,
    not this process's, plus ``env``).
    """

    command: Sequence[str] | str
    task_input: str = "stdin"
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment variables (the parent's environment is passed on too)."""

    def __post_init__(self) -> None:
        if self.task_input not in ("stdin", "argument"):
            raise ValueError(f"task_input must be 'stdin' or 'argument', got {self.task_input!r}")
        self.argv = (
            shlex.split(self.command) if isinstance(self.command, str) else list(self.command)
        )
        if not self.argv:
            raise ValueError("the command is empty")

    def describe(self) -> str:
        """The command line."""
        return shlex.join(self.argv)

    def argv_for(self, launch: Launch) -> list[str]:
        """The command line of a run (the task as the last argument, if so asked)."""
        return [*self.argv, launch.prompt] if self.task_input == "argument" else list(self.argv)

    def variables(self, launch: Launch) -> dict[str, str]:
        """The environment variables a run adds: ``env`` and the endpoint's three."""
        return {
            **self.env,
            "OPENAI_BASE_URL": launch.base_url,
            "OPENAI_API_KEY": launch.api_key,
            "OPENAI_MODEL": launch.model,
        }

    async def run(self, launch: Launch) -> ProgramResult:
        """Start the command, feed it the task, wait for it; kill its group if cancelled. With
        a session (the env has a sandbox) it runs there: :mod:`envhub.harness.sandboxed`."""
        if launch.session is not None:
            return await run_in_session(self, launch)
        try:
            # Under the guard: the command's group ends with this process however it dies
            # (a SIGKILLed `envhub eval` or `envhub serve` has no reaper to end it).
            process = await asyncio.create_subprocess_exec(
                *guarded(self.argv_for(launch), grace=LEFTOVER_GRACE_S),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=self.cwd,
                env={**os.environ, **self.variables(launch)},
                start_new_session=True,
            )
        except OSError as e:
            raise ProgramError("start", f"cannot start {self.describe()}: {e}") from e
        try:
            stdin = launch.prompt.encode() if self.task_input == "stdin" else b""
            stdout, stderr = await _communicate(process, stdin)
        finally:
            _kill_group(process)
        if process.returncode != 0:
            tail = stderr.decode(errors="replace")[-STDERR_TAIL:].strip()
            if process.returncode == CANNOT_START_CODE and tail.startswith(CANNOT_START):
                reason = tail.removeprefix(CANNOT_START).strip()
                raise ProgramError("start", f"cannot start {self.describe()}: {reason}")
            raise ProgramError(
                "exit", f"{self.describe()} exited with status {process.returncode}: {tail}"
            )
        return ProgramResult(stdout.decode(errors="replace").strip(), process.returncode)


async def _communicate(process: asyncio.subprocess.Process, stdin: bytes) -> tuple[bytes, bytes]:
    """Write stdin, read both pipes (stdout capped at :data:`MAX_OUTPUT_BYTES`) and wait for the
    command; once it has exited, kill what it left running (a child that holds the pipes open
    would otherwise keep the episode waiting for their end)."""
    assert process.stdin and process.stdout and process.stderr

    async def feed() -> None:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            process.stdin.write(stdin)
            await process.stdin.drain()
            process.stdin.close()

    async def read(stream: asyncio.StreamReader, cap: int) -> bytes:
        kept = bytearray()
        while chunk := await stream.read(65536):
            if len(kept) < cap:
                kept += chunk[: cap - len(kept)]
        return bytes(kept)

    readers = asyncio.gather(read(process.stdout, MAX_OUTPUT_BYTES), read(process.stderr, 65536))
    try:
        await feed()
        await _exited(process)
        _kill_group(process)
        await process.wait()
        out, err = await readers
    finally:
        if not readers.done():  # stopped mid-run: the readers end with the process group
            readers.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await readers
    return out, err


async def _exited(process: asyncio.subprocess.Process) -> None:
    """Wait until the command itself has exited. ``process.wait()`` also waits for its pipes to
    close, which a child it left running may never do; a pidfd says when the process is done."""
    try:
        pidfd = os.pidfd_open(process.pid)
    except (AttributeError, OSError):  # not Linux 5.3+: poll what asyncio's child watcher sets
        while process.returncode is None:
            await asyncio.sleep(0.02)
        return
    loop, done = asyncio.get_running_loop(), asyncio.Event()
    loop.add_reader(pidfd, done.set)
    try:
        await done.wait()
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)


def _kill_group(process: asyncio.subprocess.Process) -> None:
    """Kill the command and whatever it started (its process group)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def as_program(program: Program | Callable[..., Any] | Sequence[str] | str) -> Program:
    """A :class:`Program` from a program, a callable, or a command (a string or an argv list)."""
    if isinstance(program, (str, list, tuple)):
        return CommandProgram(program)
    if callable(program) and not hasattr(program, "run"):
        return CallableProgram(program)
    return program  # type: ignore[return-value]
