"""A harness env: each episode is one run of an agent program on one task.

The program calls the episode's OpenAI-compatible endpoint (see :mod:`envhub.harness.endpoint`);
each call becomes the env's next observation, and the policy's turn, sampled by the rollout
runner like any other env's, becomes the call's reply. So a harness env is an ordinary
:class:`~envhub.env.TaskEnv`: ``envhub check``, ``eval``, ``train``, ``serve`` and the Hub work
on it unchanged, and the runner records the exact tokens.

- A call whose messages repeat everything the program was shown and answered so far (and the
  same tools) continues the episode's token record: the observation is only its new messages
  (tool results, the harness's own notes). A call that does not (the harness rewrote or cut its
  history, a sub-agent, other tools) is a *prefix break*: the step's ``info`` carries
  ``new_segment`` and the observation is the whole new conversation, which the runner records
  as the next segment of the episode. ``metrics["prefix_breaks"]`` counts them.
- The episode ends when the program returns (``state.data["result"]`` holds what it returned,
  for the rubric), when it fails (recorded: ``harness.crash``, ``harness.exit``,
  ``harness.start``, ``timeout``, ``harness.request`` for a request the endpoint refused;
  never a silent reward of 0), or when a budget runs out (``max_turns`` counts calls,
  ``max_tokens`` sampled tokens: the policy's failure, scored as usual). A program that gives
  up because of what the policy wrote (an agent framework's "the model called an unknown tool"
  or "too many turns", or :class:`~envhub.harness.programs.PolicyFailure`) is also the policy's
  failure: the episode is truncated (``stop_reason`` ``program_gave_up``), scored and trained,
  and ``state.data["failure"]`` says why. However it ends, the
  program is stopped (a command's whole process group is killed).
- Sampling belongs to the run: a call's temperature, max tokens, stop and seed are ignored
  (logged once per field), and fields that would bias training (``n > 1``, ``top_p < 1``, a
  logit bias, penalties) are refused with a 400 that says why.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import gymnasium as gym

from envhub.env import NEW_SEGMENT, Action, StepResult, TaskEnv
from envhub.errors import EnvhubError
from envhub.harness.endpoint import Call, Endpoint, Episode, ProgramEnded, Spawned
from envhub.harness.host import HostedProgram
from envhub.harness.programs import CommandProgram, Launch, Program, ProgramError, as_program
from envhub.harness.wire import Reply, extends, message_key
from envhub.rewards.rubric import Rubric
from envhub.rows import RequiredField
from envhub.sandbox.base import Sandbox
from envhub.sandbox.session import Session, Workspace
from envhub.state import State
from envhub.tools.executor import count_calls_run_elsewhere
from envhub.tools.parsers import ParsedTurn, check_openai_calls, get_parser
from envhub.types import AssistantTurn, ErrorRecord, Message

logger = logging.getLogger(__name__)

_warned: set[str] = set()


class HarnessError(EnvhubError):
    """A harness episode that could not start (the program made no call)."""


class _Run:
    """One episode's mailbox (on the endpoint), its program (on the programs' loop) and its
    sandbox session, if any."""

    def __init__(
        self, endpoint: Endpoint, episode: Episode, program: Spawned, session: Session | None
    ) -> None:
        self.endpoint, self.episode, self.program = endpoint, episode, program
        self.session = session

    async def next_event(self, reply: Reply | None) -> tuple[Any, list[str]]:
        """Answer the waiting call with ``reply`` (if any), then wait for the next event;
        also return the requests refused since the last event."""
        if reply is not None:
            self.episode.answer(reply)
        event = await self.episode.next_event()
        return event, self.episode.take_refused()

    async def stop(self, why: str) -> None:
        """Close the mailbox, stop the program (kills a command's process group), and end the
        session (every process in it)."""
        self.endpoint.discard(self.episode, why)
        try:
            if not self.program.done():  # a program that ignores cancellation for 10 s is left
                await self.program.cancel()
        finally:
            if self.session is not None:
                await self.session.aclose()


def _placed(program: Program, host: str) -> Program:
    """``program`` as it runs in the chosen ``program_host``."""
    if host not in ("thread", "process"):
        raise ValueError(f"program_host must be 'thread' or 'process', got {host!r}")
    if host == "thread" or isinstance(program, CommandProgram):
        return program
    return HostedProgram(program)


async def _supervise(
    program: Program, launch: Launch, endpoint: Endpoint, episode: Episode, timeout: float
) -> None:
    """Run ``program`` to its end and post how it ended to ``episode``."""
    try:
        result = await asyncio.wait_for(program.run(launch), timeout)
        ended = ProgramEnded(result.output, result.exit_code)
    except TimeoutError:
        ended = ProgramEnded(failure="timeout", message=f"the program ran over {timeout:g} s")
    except ProgramError as e:
        ended = ProgramEnded(failure=e.kind, message=str(e))
    except Exception as e:  # noqa: BLE001 - whatever a program does is recorded, not raised
        ended = ProgramEnded(failure="crash", message=f"{type(e).__name__}: {e}")
    endpoint.post(episode, ended)


class HarnessEnv(TaskEnv):
    """An env whose episodes are runs of an agent program (see the module doc).

    Args:
        program: What runs per episode: an ``async``/sync function (its parameters are filled by
            name: ``client``, ``base_url``, ``api_key``, ``task``, ``prompt``, ``model``), a
            command (a string or argv list; see
            :class:`~envhub.harness.programs.CommandProgram`), or a
            :class:`~envhub.harness.programs.Program`. Defaults to :meth:`make_program`.
        dataset: The tasks (rows with ``prompt`` or ``question``, and what the rubric reads).
        rubric: Rewards; they read the program's result as ``state.data["result"]``.
        max_turns: Calls the program may make before the episode is truncated.
        max_tokens: Tokens the policy may sample in the episode.
        timeout: Seconds the program may run in all.
        tool_parser: How tool calls are read from the policy's text (``auto``, ``hermes``, ...).
        call_reward: Paid at once (``State.pay``, component ``tool_use``) for the episode's
            first turn whose tool calls are all well formed and name tools of the call: a dense
            reward for learning the call format before the task. Any such call earns it, so it
            is the env's ``audit_floor``.
        program_host: Where a Python program runs: ``thread`` (a thread of the runner's
            process) or ``process`` (a child process shared by the process's episodes, see
            :mod:`envhub.harness.host`: its clients' CPU then runs beside the runner's instead
            of under its interpreter lock; the function must be defined at module level).
            Commands run in their own process either way.
        sandbox: Gives each episode a session of this sandbox (from ``reset`` to the end,
            ``state.data["session"]``, which rewards may read): a command program runs in it,
            reaching the endpoint and nothing else (:mod:`envhub.harness.sandboxed`); a
            function may take ``session`` to run its tools there.
        workspace: What each session's ``/sandbox`` starts as (copy-on-write; see
            :meth:`workspace_for`).
    """

    name = "harness"
    version = "0.1.0"
    default_max_turns = 32
    default_timeout: ClassVar[float] = 600.0
    tool_parser: ClassVar[str] = "auto"
    tools_come_from_program: ClassVar[bool] = True
    """Its tools arrive with the program's calls: ``tool_schemas`` cannot list them before an
    episode (what ``eval``, ``train`` and the dry run say about tools reads this)."""

    def __init__(
        self,
        program: Program | Callable[..., Any] | Sequence[str] | str | None = None,
        dataset: Sequence[dict[str, Any]] | None = None,
        *,
        rubric: Rubric | None = None,
        max_turns: int | None = None,
        max_tokens: int | None = None,
        timeout: float | None = None,
        tool_parser: str | None = None,
        call_reward: float = 0.0,
        program_host: str = "thread",
        sandbox: Sandbox | None = None,
        workspace: Workspace | str | os.PathLike[str] | None = None,
    ) -> None:
        if call_reward < 0:
            raise ValueError(f"{self.name}: call_reward must be >= 0, got {call_reward}")
        self.call_reward = float(call_reward)
        if self.call_reward:
            low, high = self.reward_range
            self.reward_range = (low, high + self.call_reward)
            self.audit_floor = self.call_reward
        super().__init__(dataset, rubric=rubric, max_turns=max_turns, max_tokens=max_tokens)
        self.program = _placed(
            as_program(program if program is not None else self.make_program()), program_host
        )
        if sandbox is not None and isinstance(self.program, HostedProgram):
            raise ValueError(
                f"{self.name}: a program in the program host cannot use the episode's sandbox "
                "session; use program_host='thread', or a command"
            )
        # Not `self.sandbox`: by the code envs' convention that names a sandbox whose None means
        # the default one (envhub.evaluation.perf), where here None means no session at all.
        self.session_sandbox = sandbox
        self.workspace = workspace
        self.timeout = timeout if timeout is not None else self.default_timeout
        self._parse = get_parser(tool_parser or self.tool_parser)
        self._run: _Run | None = None
        self._tools: list[dict[str, Any]] | None = None
        self._shown: list[Message] = []
        """The conversation as the program has seen it: its last call's messages + our reply."""
        self._sampled: dict[tuple[Any, ...], Message] = {}
        """Our replies as the program sees them (by :func:`message_key`) -> the turns as
        sampled, so that a re-sent reply renders as the policy wrote it."""
        self._new_segment = False

    # -- hooks for subclasses -------------------------------------------------------------------

    def make_program(self) -> Program | Callable[..., Any] | Sequence[str] | str:
        """The program to run when none is passed in."""
        raise EnvhubError(f"{self.name}: pass `program=` or override `make_program()`")

    def workspace_for(self, task: dict[str, Any]) -> Workspace | str | os.PathLike[str] | None:
        """What the task's session starts from (with a ``sandbox``): the env's ``workspace``."""
        return self.workspace

    def session_for(self, task: dict[str, Any]) -> Session | None:
        """The episode's session (not yet started), when the env has a ``sandbox``: on
        :meth:`workspace_for`; override to ask the sandbox for more (a task's own image and
        paths)."""
        if self.session_sandbox is None:
            return None
        return self.session_sandbox.session(self.workspace_for(task))

    def task_text(self, task: dict[str, Any]) -> str:
        """The task as the program gets it (``prompt``/stdin): its ``prompt`` or ``question``."""
        text = task.get("prompt", task.get("question"))
        return text if isinstance(text, str) else json.dumps(text)

    def required_fields(self) -> list[RequiredField]:
        """As :meth:`TaskEnv.required_fields`, with :meth:`task_text` reading the question."""
        fields = [f for f in super().required_fields() if f.names != ("prompt", "question")]
        if type(self).task_text is HarnessEnv.task_text:
            fields.append(RequiredField(("prompt", "question"), "task_text"))
        return fields

    # -- the gym API ----------------------------------------------------------------------------

    @property
    def tool_schemas(self) -> list[dict[str, Any]] | None:
        """The tools of the program's latest call."""
        return self._tools

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Start the program on a task and return its first call's messages.

        Raises:
            HarnessError: The program ended (or failed) before its first call.
        """
        gym.Env.reset(self, seed=seed)
        await self._stop("a new episode started")
        index, task = self._choose_task(options or {})
        self.state = State(task=task, task_index=index, prompt=[], messages=[])
        self._sampled = {}
        if self.call_reward:
            self.state.paid["tool_use"] = 0.0
        await self.setup_state(self.state)
        endpoint = Endpoint.shared()
        self._run = self._start(endpoint, task)
        event, refused = await self._next(None)
        if not isinstance(event, Call):
            await self._stop("the program ended")
            why = event.message or (
                f"it returned {event.output!r}" if event.failure is None else event.failure
            )
            refusals = f" (refused: {'; '.join(refused)})" if refused else ""
            raise HarnessError(
                f"{self.program.describe()} made no call to the endpoint: {why}{refusals}"
            )
        self._record_refused(self.state, refused)
        self.state.metrics.update(segments=1, prefix_breaks=0)
        self._tools = event.request.tools
        self._shown = list(event.request.messages)
        self.state.prompt = list(event.request.messages)
        self.state.messages = list(event.request.messages)
        return list(self.state.prompt), {"task_index": index}

    async def astep(self, action: Action) -> StepResult:
        """Answer the program's call with the turn; the next call is the observation."""
        self._new_segment = False
        observation, reward, terminated, truncated, info = await super().astep(action)
        if self._new_segment:
            info = {**info, NEW_SEGMENT: True, "tools": self._tools}
        if terminated or truncated:
            await self._stop("the episode ended")
        return observation, reward, terminated, truncated, info

    async def atruncate(self, reason: str) -> tuple[float, dict[str, Any]]:
        """End the episode from outside (the runner ran out of context) and stop the program."""
        try:
            return await super().atruncate(reason)
        finally:
            await self._stop(f"the episode was cut ({reason})")

    async def env_response(self, state: State, turn: AssistantTurn) -> list[Message]:
        """Send the turn to the waiting call; wait for the next call or the program's end."""
        reply = self._reply(state, turn)
        self._shown.append(reply.message)
        self._sampled[message_key(reply.message)] = turn.message
        event, refused = await self._next(reply)
        self._record_refused(state, refused)
        if isinstance(event, ProgramEnded):
            if event.failure == "policy":  # truncated, not done: the policy's failure
                state.data["failure"] = event.message
                state.truncate("program_gave_up")
                return []
            state.done = True
            if event.failure is None:
                state.data["result"] = event.output
            else:
                state.errors.append(self._failure(event, state.turn))
            return []
        request = event.request
        self._warn_overridden(request.overridden)
        if request.tools == self._tools and extends(self._shown, request.messages):
            new = list(request.messages[len(self._shown) :])
            self._shown = list(request.messages)
            return new
        state.metrics["prefix_breaks"] += 1
        state.metrics["segments"] += 1
        self._new_segment, self._tools = True, request.tools
        self._shown = list(request.messages)
        return [self._sampled.get(message_key(m), m) for m in request.messages]

    def on_close(self) -> None:
        """Stop a program still running."""
        if self._run is not None:
            run, self._run = self._run, None
            try:
                run.endpoint.run(run.stop("the env was closed")).result(timeout=30)
            except Exception:  # noqa: BLE001 - closing must not raise
                logger.warning("stopping %s raised", self.program.describe(), exc_info=True)

    # -- internals ------------------------------------------------------------------------------

    def _start(self, endpoint: Endpoint, task: dict[str, Any]) -> _Run:
        session = self.session_for(task)
        if session is not None:
            self.state.data["session"] = session
        episode = endpoint.open()
        launch = Launch(
            endpoint.base_url(episode.key),
            episode.key,
            task,
            self.task_text(task),
            timeout=self.timeout,
            session=session,
        )
        running = _supervise(self.program, launch, endpoint, episode, self.timeout)
        return _Run(endpoint, episode, endpoint.spawn(running), session)

    async def _next(self, reply: Reply | None) -> tuple[Call | ProgramEnded, list[str]]:
        run = self._active_run()
        return await run.next_event(reply)

    async def _stop(self, why: str) -> None:
        if self._run is not None:
            run, self._run = self._run, None
            await run.stop(why)

    def _active_run(self) -> _Run:
        if self._run is None:
            raise EnvhubError(f"{self.name}: call reset() before step()")
        return self._run

    def _reply(self, state: State, turn: AssistantTurn) -> Reply:
        """The turn as the program sees it: text without call markup, and the calls."""
        message = turn.message
        text = message.content or ""
        if message.tool_calls:
            parsed = check_openai_calls(text, message.tool_calls)
        elif self._tools:
            parsed = self._parse(text, f"call_{state.turn}_")
        else:
            parsed = ParsedTurn(text)
        if parsed.calls and not message.tool_calls:  # recorded as a native tool env does
            state.messages[-1] = message.model_copy(update={"tool_calls": tuple(parsed.calls)})
        offered = {t["function"]["name"] for t in self._tools or ()}
        invalid = count_calls_run_elsewhere(state.metrics, parsed, offered)
        well_formed = parsed.calls and not invalid
        if self.call_reward and well_formed:
            state.pay_once(self.call_reward, "tool_use")
        # A malformed call stays in the text, so that the program shows the policy its mistake.
        content = text if parsed.errors else parsed.content
        if parsed.calls:
            finish = "tool_calls"
        else:
            finish = "length" if turn.finish_reason == "length" else "stop"
        return Reply(
            content if content or not parsed.calls else None,
            list(parsed.calls),
            finish,
            turn.num_tokens or 0,
        )

    @staticmethod
    def _failure(event: ProgramEnded, turn: int) -> ErrorRecord:
        kind = event.failure or "crash"
        if kind == "timeout":
            return ErrorRecord(
                stage="harness.program", type="timeout", message=event.message, turn=turn
            )
        return ErrorRecord(stage=f"harness.{kind}", type=kind, message=event.message, turn=turn)

    @staticmethod
    def _record_refused(state: State, refused: list[str]) -> None:
        for message in refused:
            state.errors.append(
                ErrorRecord(
                    stage="harness.request", type="bad_request", message=message, turn=state.turn
                )
            )

    def _warn_overridden(self, fields: list[str]) -> None:
        for name in fields:
            if name not in _warned:
                _warned.add(name)
                logger.warning(
                    "%s sets %s on its calls; the run's sampling settings are used instead "
                    "(said once per field)",
                    self.program.describe(),
                    name,
                )
