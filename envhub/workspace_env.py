"""A base env for tasks done in a workspace: a sandbox session for the episode, the terminal
tools, and a verifier that runs in the session when the episode ends.

:class:`WorkspaceEnv` is a :class:`~envhub.multiturn.ToolEnv` whose ``reset`` opens a session
(:meth:`~envhub.sandbox.Sandbox.session`) on the task's prepared
:class:`~envhub.sandbox.Workspace`, and offers ``bash``, ``view``, ``create`` and
``str_replace`` (:mod:`envhub.tools.terminal`) bound to it. One workspace is prepared per task
and kept (:data:`WORKSPACES`): the samples of a group, and later episodes of the same task,
start from it copy-on-write, so nothing is copied per episode.

The episode ends when the model answers without a tool call, or when a budget runs out: turns,
tokens, the runner's truncation, or the task's time limit (:meth:`WorkspaceEnv.time_limit`,
stop reason ``time_limit``, checked after each turn). Either way its reward comes from
:meth:`WorkspaceEnv.verify`, run in the session before it closes; a verifier that fails (its
own bug, a broken sandbox) scores 0 with the error recorded on the episode (an infrastructure
error for a sandbox failure). An episode cut off before it ends (an engine failure) closes its
session at the env's next ``reset`` or ``close``. Subclasses implement
:meth:`~WorkspaceEnv.task_files` (or :meth:`~WorkspaceEnv.workspace_for`) and
:meth:`~WorkspaceEnv.verify`.

An env whose verdict depends on nothing but the task and the files the episode leaves declares
it (:attr:`WorkspaceEnv.verdict_from_files`); inside :meth:`WorkspaceEnv.reusing_verdicts`, an
episode that ends with the same files as an earlier one of the same task then gets that
episode's verdict without running the verifier (the reward audit plays dozens of policies that
never touch the workspace).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from envhub.multiturn import TOOL_FORMAT_HINT, ToolEnv
from envhub.rewards.rubric import Rubric, reward
from envhub.sandbox.base import WORKDIR, Limits, Sandbox
from envhub.sandbox.digest import files_digest
from envhub.sandbox.session import Session, Workspace
from envhub.state import State
from envhub.tools.terminal import MAX_OUTPUT_CHARS, TERMINAL_TOOLS, terminal_context

logger = logging.getLogger(__name__)

SESSION_LIMITS = Limits(
    wall_time=30.0, memory_mb=1024, processes=64, disk_mb=256, output_bytes=1 << 20
)
"""Limits of each command in an episode's session (``processes`` and ``disk_mb`` hold for the
whole session)."""
WORKSPACES: OrderedDict[tuple[str, str], Workspace] = OrderedDict()
"""Prepared workspaces by (env class, task key), most recently used last."""
MAX_WORKSPACES = 256
LIVE_SESSIONS = 64
"""Sessions the default sandbox keeps alive at once (each holds a uid for its episode, model
turns included); an episode beyond them waits in ``reset`` for one to end."""
_default_sandbox: Sandbox | None = None


def workspace_prompt(workdir: str = WORKDIR) -> str:
    """The system prompt of workspace envs whose commands start in ``workdir``: the folder,
    the tools, and how an episode ends. A ``workdir`` other than ``/sandbox`` is named as the
    same folder (where the session shows it again: :meth:`WorkspaceEnv.workdir_for`)."""
    where = WORKDIR if workdir == WORKDIR else f"{workdir} (the same folder as {WORKDIR})"
    return (
        f"You are working in a sandbox whose current folder is {where}, with tools to run shell "
        "commands (`bash`), view files and folders (`view`), write files (`create`) and edit "
        "them (`str_replace`). There is no network.\n\n"
        + TOOL_FORMAT_HINT
        + "\n\nWhen the task is done, reply without a tool call."
    )


WORKSPACE_PROMPT = workspace_prompt()
"""The system prompt of workspace envs whose commands start in ``/sandbox``."""


@dataclass(frozen=True)
class Verdict:
    """What a verifier found: the reward and any extra components to report (weight 0)."""

    reward: float
    components: dict[str, float] = field(default_factory=dict)
    output: str = ""
    """The end of what the verifier printed (for a person reading why it scored so)."""


def default_sandbox() -> Sandbox:
    """The process-wide local sandbox for workspace envs (pytest mounted when the system's
    ``python3`` lacks it; see :mod:`envhub.checks.pytest_bundle`)."""
    global _default_sandbox
    if _default_sandbox is None:
        from envhub.checks.pytest_bundle import pytest_bundle
        from envhub.sandbox.local import LocalSandbox

        bundle = pytest_bundle()
        _default_sandbox = LocalSandbox(
            max_concurrency=LIVE_SESSIONS, ro_binds=(str(bundle),) if bundle else ()
        )
    return _default_sandbox


def default_command_env() -> dict[str, str]:
    """Variables every command of a workspace session gets (``PYTHONPATH`` to the pytest
    bundle, when there is one)."""
    from envhub.checks.pytest_bundle import pytest_bundle

    bundle = pytest_bundle()
    return {"PYTHONPATH": str(bundle)} if bundle else {}


class WorkspaceEnv(ToolEnv):
    """An env whose episodes work in a sandbox session and are scored by a verifier in it.

    Args:
        sandbox: Where sessions run (default: :func:`default_sandbox`, local bubblewrap).
        limits: Limits of each command in the session (default :data:`SESSION_LIMITS`).
        **kwargs: See :class:`~envhub.multiturn.ToolEnv` (``max_turns`` defaults to 30).
    """

    tools = TERMINAL_TOOLS
    default_max_turns: ClassVar[int] = 30
    reward_range = (0.0, 1.0)
    verdict_from_files: ClassVar[bool] = False
    """Declares that :meth:`verify`'s verdict depends on nothing but the task and the session's
    files once the model's processes are ended (what :func:`~envhub.sandbox.digest.files_digest`
    reads: paths, contents, modes, files' times): not on the conversation, a clock or chance.
    It lets :meth:`reusing_verdicts` reuse verdicts."""
    episodes_in_state: ClassVar[bool] = False
    """Declares that an episode keeps all it changes in its ``state`` and session, nothing on
    the env itself (beyond what :class:`WorkspaceEnv` keeps): :meth:`episode_copy` may then
    make copies that play episodes alongside this one."""

    def __init__(
        self,
        *args: Any,
        sandbox: Sandbox | None = None,
        limits: Limits | None = None,
        **kwargs: Any,
    ) -> None:
        self.sandbox = sandbox
        self.limits = limits or SESSION_LIMITS
        kwargs.setdefault("tool_timeout", self.limits.wall_time + 30.0)
        super().__init__(*args, **kwargs)
        # The terminal tools cap their own output and say so; the executor's cap stays above.
        self.executor.max_output_chars = MAX_OUTPUT_CHARS + 1000
        self._session: Session | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._verdicts: dict[tuple[int, str, str], Verdict] | None = None

    # -- hooks for subclasses -----------------------------------------------------------------

    def task_key(self, task: dict[str, Any]) -> str:
        """What identifies a task's workspace (default: its ``info["id"]``)."""
        return str(task.get("info", {}).get("id"))

    def task_files(self, task: dict[str, Any]) -> Mapping[str, str | bytes]:
        """The files a task's workspace starts with."""
        raise NotImplementedError(f"{type(self).__name__} must implement task_files()")

    def workspace_for(self, task: dict[str, Any]) -> Workspace:
        """The task's prepared workspace: made once from :meth:`task_files`, then shared."""
        key = (type(self).__qualname__, self.task_key(task))
        workspace = WORKSPACES.get(key)
        if workspace is None:
            workspace = Workspace.from_files(self.task_files(task))
            WORKSPACES[key] = workspace
            while len(WORKSPACES) > MAX_WORKSPACES:  # a live session keeps its own reference
                WORKSPACES.popitem(last=False)
        WORKSPACES.move_to_end(key)
        return workspace

    def session_for(self, sandbox: Sandbox, workspace: Workspace, task: dict[str, Any]) -> Session:
        """The (not yet started) session of an episode of ``task``: on ``workspace`` with
        :meth:`limits_for` by default; override to ask the sandbox for more (folders at a
        task's own paths: :class:`~envhub.sandbox.session.SessionPaths`)."""
        return sandbox.session(workspace, limits=self.limits_for(task))

    def command_env(self, task: dict[str, Any]) -> dict[str, str]:
        """Variables the model's commands run with (default: :func:`default_command_env`)."""
        return default_command_env()

    def workdir_for(self, task: dict[str, Any]) -> str:
        """The model's current folder in an episode of ``task``: where its commands start and
        what its file tools take paths under besides ``/sandbox`` (default ``/sandbox``). A
        path other than ``/sandbox`` must be one where :meth:`session_for`'s session shows the
        working folder again (:attr:`~envhub.sandbox.session.SessionPaths.workdir`); name it
        in the system prompt (:func:`workspace_prompt`)."""
        return WORKDIR

    def limits_for(self, task: dict[str, Any]) -> Limits:
        """The limits of a task's session (default: the env's ``limits``)."""
        return self.limits

    def time_limit(self, task: dict[str, Any]) -> float | None:
        """Seconds an episode of ``task`` may last from its reset, model turns included
        (default ``None``: no limit but the turn and token budgets)."""
        return None

    async def verify(self, session: Session, state: State) -> Verdict:
        """Score the finished episode by running checks in its session (start with
        ``await session.akill_processes()``: the model's background processes live on)."""
        raise NotImplementedError(f"{type(self).__name__} must implement verify()")

    # -- the episode ----------------------------------------------------------------------------

    def default_rubric(self) -> Rubric:
        """One reward, ``verifier``: what :meth:`verify` found."""
        return Rubric([reward(self._verifier_reward, name="verifier")])

    def tool_context(self, state: State) -> dict[str, Any]:
        """The terminal tools' context (the session and command variables) plus ``state``."""
        return {"state": state, **state.data}

    async def setup_state(self, state: State) -> None:
        """Close a session an earlier episode left open, and open this episode's."""
        await self._end_session()
        sandbox = self.sandbox or default_sandbox()
        workspace = self.workspace_for(state.task)
        limit = self.time_limit(state.task)
        if limit is not None:
            state.data["deadline"] = time.monotonic() + limit
        self._session = self.session_for(sandbox, workspace, state.task)
        # Start it now: waiting for a free uid, or a sandbox that cannot start, belongs to the
        # reset (an env failure), not to the model's first tool call (a tool timeout).
        await self._session.__aenter__()
        variables, workdir = self.command_env(state.task), self.workdir_for(state.task)
        state.data.update(terminal_context(self._session, variables, workdir), workspace=workspace)

    def _budget_exhausted(self, state: State) -> bool:
        if super()._budget_exhausted(state):
            return True
        deadline = state.data.get("deadline")
        if deadline is not None and time.monotonic() >= deadline:
            state.stop_reason = "time_limit"
        return state.stop_reason is not None

    async def _finish(self, state: State) -> float:
        try:
            total = await super()._finish(state)
        finally:
            await self._end_session()
        verdict = state.data.get("verdict")
        if isinstance(verdict, Verdict):
            state.reward_components.update(verdict.components)
        return total

    def episode_copy(self) -> WorkspaceEnv | None:
        """A copy that plays its own episodes (its own state and session) at the same time as
        this env's: the same settings, dataset, tools, rubric, sandbox and reused verdicts;
        ``None`` unless the env declares :attr:`episodes_in_state`. Close it when done."""
        if not self.episodes_in_state:
            return None
        twin = copy.copy(self)
        twin.state, twin._session, twin._closing, twin._closed = None, None, set(), False
        return twin

    @contextlib.contextmanager
    def reusing_verdicts(self) -> Iterator[None]:
        """Within the block, an episode that ends with the same files (the same
        :func:`~envhub.sandbox.digest.files_digest`) as an earlier one of the same task gets
        that episode's verdict instead of running :meth:`verify` (``state.data
        ["verdict_reused"]`` says so). Sound because the env declares its verdict a function of
        the task and those files (:attr:`verdict_from_files`; without it, or a digest, every
        episode is verified). Verdicts are forgotten when the block ends."""
        previous, self._verdicts = self._verdicts, {}
        try:
            yield
        finally:
            self._verdicts = previous

    async def _verifier_reward(self, state: State) -> float:
        session = state.data.get("session")
        if session is None:
            raise RuntimeError("the episode has no session to verify")
        verdicts = self._verdicts if self.verdict_from_files else None
        key = None if verdicts is None else await self._verdict_key(session, state)
        verdict = None if verdicts is None or key is None else verdicts.get(key)
        state.data["verdict_reused"] = verdict is not None
        if verdict is None:
            verdict = await self.verify(session, state)
            if verdicts is not None and key is not None:
                verdicts[key] = verdict
        state.data["verdict"] = verdict
        return verdict.reward

    async def _verdict_key(self, session: Session, state: State) -> tuple[int, str, str] | None:
        """(task index, task, files' digest): what a verdict is a function of; ``None`` when
        the session has no digest."""
        await session.akill_processes()  # one left running could change a file once read
        digest = await files_digest(session)
        return None if digest is None else (state.task_index, repr(state.task), digest)

    async def _end_session(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.aclose()

    def on_close(self) -> None:
        """Close the open session, if an episode was cut off with one."""
        session, self._session = self._session, None
        if session is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            session.close()  # no loop running: the env was used from sync code
            return
        task = loop.create_task(session.aclose())  # on the loop the session was opened on
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
