"""Harbor task folders as an env: :class:`HarborEnv`, and the solution check.

``envhub.make("path/to/task")`` (one task folder) or ``envhub.make("path/to/tasks")`` (a
folder of them) gives a :class:`HarborEnv`. An episode: the instruction is the prompt, the
workspace holds the files the task's Dockerfile copies (:mod:`envhub.harbor.task`) and what its
``RUN`` steps made (run once per task, before its first episode: :mod:`envhub.harbor.build`),
and the model works with the terminal tools. When it ends, every process the model left is killed,
``tests/`` is copied into a fresh folder out of the workspace (``/tmp/.harbor``, with ``/tmp``
cleared of test-runner configuration: see :mod:`envhub.harbor.task`) and ``test.sh`` runs in
the session with the verifier's timeout, the task's variables and no Python user site (the
model's home is the workspace); the reward is what it wrote, as Harbor reads it:

- ``reward.json`` first: a JSON object of numbers; the reward is its ``"reward"`` key, or its
  only value, else the mean of its values (every key is also reported as a weight-0
  component);
- else ``reward.txt``: one number.

Rewards must lie in [0, 1] (binary or partial). A test script that leaves neither file, an
empty or malformed one, scores 0 and records a :class:`~envhub.errors.VerifierError` with the
end of its output; a session that breaks records an infrastructure error.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envhub.errors import EnvLoadError, VerifierError
from envhub.harbor.build import prepare, prepared
from envhub.harbor.dockerfile import UnsupportedEnvironment
from envhub.harbor.task import (
    HARBOR_DIR,
    SOLUTION_DIR,
    VERIFIER_DIR,
    HarborTask,
    find_task_folders,
    load_task,
    rewrite_bytes,
    verifier_paths,
)
from envhub.sandbox.base import ExecResult, Limits
from envhub.sandbox.session import Session, Workspace
from envhub.state import State
from envhub.types import Message
from envhub.workspace_env import WORKSPACE_PROMPT, Verdict, WorkspaceEnv


class HarborEnv(WorkspaceEnv):
    """The tasks of a Harbor task folder (or of a folder of task folders).

    Args:
        path: A task folder, or a folder whose subfolders are tasks.
        skip_unsupported: Leave out tasks whose environment cannot run here (else they are
            refused, with the image named).
        **kwargs: See :class:`~envhub.workspace_env.WorkspaceEnv`.

    Raises:
        EnvLoadError: A malformed task folder (the message names the file).
        UnsupportedEnvironment: A task needs a container build (and not ``skip_unsupported``),
            or no task can run here.
    """

    name = "harbor"
    version = "0.1.0"
    system_prompt = WORKSPACE_PROMPT

    def __init__(self, path: str | Path, *, skip_unsupported: bool = False, **kwargs: Any) -> None:
        self.path = Path(path)
        self.tasks = _load_all(find_task_folders(self.path), skip_unsupported)
        rows = [
            {"question": t.instruction, "info": {"id": key, "name": t.name}}
            for key, t in self.tasks.items()
        ]
        super().__init__(rows, **kwargs)
        solutions = {t.instruction: t.solution for t in self.tasks.values()}
        complete = all(solutions.values()) and len(solutions) == len(self.tasks)
        variables = {t.instruction: t.resources.solution_env for t in self.tasks.values()}
        self.reference_policy = (
            _solution_policy(solutions, variables)  # type: ignore[arg-type]
            if complete and self.max_turns >= 3
            else None
        )

    def task_of(self, task: dict[str, Any]) -> HarborTask:
        """The Harbor task of a dataset row."""
        return self.tasks[task["info"]["id"]]

    def task_key(self, task: dict[str, Any]) -> str:
        """The task folder's path."""
        return str(task["info"]["id"])

    def task_files(self, task: dict[str, Any]) -> dict[str, bytes]:
        """The files the task's Dockerfile puts in its working folder."""
        return self.task_of(task).files

    def workspace_for(self, task: dict[str, Any]) -> Workspace:
        """The prepared workspace: the one its ``RUN`` steps made (prepared now if need be:
        see :meth:`prepare_workspace`), else the task's files, executables executable."""
        harbor = self.task_of(task)
        if harbor.build is not None:
            from envhub._async import run_sync

            return prepared(harbor.build) or run_sync(self.prepare_workspace(task))
        workspace = super().workspace_for(task)
        for name in self.task_of(task).executables:
            (workspace.path / name).chmod(0o777)
        return workspace

    async def prepare_workspace(self, task: dict[str, Any]) -> Workspace:
        """The task's workspace, running its Dockerfile's ``RUN`` steps first if no process
        has yet (:mod:`envhub.harbor.build`).

        Raises:
            UnsupportedEnvironment: A step failed (its line, the step, its output's end).
        """
        harbor = self.task_of(task)
        if harbor.build is None:
            return self.workspace_for(task)
        variables = super().command_env(task)  # the Dockerfile's ENV: each step its own
        return await prepare(harbor.build, self.sandbox, self.limits_for(task), variables)

    async def setup_state(self, state: State) -> None:
        """Prepare the task's workspace (once per task), then open the episode's session."""
        await self.prepare_workspace(state.task)
        await super().setup_state(state)

    def command_env(self, task: dict[str, Any]) -> dict[str, str]:
        """The Dockerfile's ``ENV`` variables, over the default ones."""
        return {**super().command_env(task), **self.task_of(task).env}

    def limits_for(self, task: dict[str, Any]) -> Limits:
        """The env's limits with the task's memory and storage (``task.toml``), and no command
        longer than the agent's timeout (see :mod:`envhub.harbor.resources`)."""
        resources = self.task_of(task).resources
        changes: dict[str, Any] = {}
        if resources.memory_mb is not None:
            changes["memory_mb"] = resources.memory_mb
        if resources.storage_mb is not None:
            changes["disk_mb"] = resources.storage_mb
        if resources.agent_timeout is not None:
            changes["wall_time"] = min(self.limits.wall_time, resources.agent_timeout)
        return self.limits.with_(**changes)

    def time_limit(self, task: dict[str, Any]) -> float | None:
        """The task's ``[agent] timeout_sec``."""
        return self.task_of(task).resources.agent_timeout

    async def verify(self, session: Session, state: State) -> Verdict:
        """Kill what the model left running, run ``tests/test.sh``, read the reward."""
        return await run_verifier(session, self.task_of(state.task), self.command_env(state.task))


async def run_verifier(session: Session, task: HarborTask, env: dict[str, str]) -> Verdict:
    """Run a task's tests in ``session`` and read the reward they wrote.

    Raises:
        VerifierError: No reward file, or a malformed one (with the script's output's end).
    """
    await session.akill_processes()
    folder = verifier_folder(session)
    paths = verifier_paths(folder)
    await session.arun(["/bin/sh", "-c", _CLEAR, "sh", folder, *RUNNER_CONFIGS])
    for name, data in task.tests.items():
        await _put(session, f"{paths['/tests']}/{name}", rewrite_bytes(data, paths))
    await session.arun(["chmod", "-R", "a+x", paths["/tests"]])  # as Harbor copies them
    await session.arun(["mkdir", "-p", paths["/logs/verifier"]])
    result = await session.arun(
        ["bash", f"{paths['/tests']}/test.sh"],
        wall_time=task.verifier_timeout,
        env={**env, **task.verifier_env, "PYTHONNOUSERSITE": "1"},
    )
    return await read_reward(session, task, result)


async def read_reward(session: Session, task: HarborTask, result: ExecResult) -> Verdict:
    """The reward ``test.sh`` wrote: ``reward.json`` first, else ``reward.txt``.

    Raises:
        VerifierError: Neither file, or one that does not hold a reward in [0, 1].
    """
    where = task.path / "tests" / "test.sh"
    logs = verifier_paths(verifier_folder(session))["/logs/verifier"]
    for name, parse in (("reward.json", _json_reward), ("reward.txt", _text_reward)):
        text = await _get(session, f"{logs}/{name}")
        if text is None:
            continue
        verdict = parse(text, f"{where} wrote {name}")
        if not 0.0 <= verdict.reward <= 1.0:
            raise VerifierError(f"{where} wrote {name} with reward {verdict.reward}, not in [0, 1]")
        return verdict
    tail = (result.stdout + result.stderr).strip()[-500:]
    raise VerifierError(
        f"{where} wrote no reward ({result.describe()}): it must write /logs/verifier/reward.txt "
        f"or reward.json. Its output ended with: {tail or '(nothing)'}"
    )


def verifier_folder(session: Session) -> str:
    """Where the tests and the reward go: out of the workspace (:data:`VERIFIER_DIR`) in a
    local session; in it (``/sandbox/.harbor``) where ``/tmp`` may not last from one command
    to the next."""
    from envhub.sandbox.local_session import LocalSession

    return VERIFIER_DIR if isinstance(session, LocalSession) else HARBOR_DIR


RUNNER_CONFIGS = (
    "pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg", "setup.py",
    "conftest.py", "__init__.py",
)  # fmt: skip
"""Files a test runner reads from the folders above its tests: taken out of ``/tmp``."""
_CLEAR = 'rm -rf -- "$1"; shift; cd /tmp && rm -rf -- "$@"'
_PUT = 'mkdir -p -- "$(dirname -- "$1")" && exec cat > "$1"'
_GET = 'if [ -f "$1" ] && [ ! -L "$1" ]; then exec head -c 65536 -- "$1"; fi; exit 102'


async def _put(session: Session, path: str, data: bytes) -> None:
    """Write a file anywhere the session may (``write_file`` keeps to ``/sandbox``)."""
    result = await session.arun(["/bin/sh", "-c", _PUT, "sh", path], stdin=data)
    if not result.ok:
        raise VerifierError(f"could not write {path} in the session: {result.describe()}")


async def _get(session: Session, path: str) -> str | None:
    """A regular file's text (its first 64 KiB), or ``None`` when there is none."""
    result = await session.arun(["/bin/sh", "-c", _GET, "sh", path])
    return result.stdout if result.ok else None


def _text_reward(text: str, where: str) -> Verdict:
    if not text.strip():
        raise VerifierError(f"{where}, but it is empty")
    try:
        value = float(text.strip())
    except ValueError:
        raise VerifierError(f"{where}, but it holds {text.strip()[:80]!r}, not a number") from None
    return Verdict(_finite(value, where))


def _json_reward(text: str, where: str) -> Verdict:
    try:
        data = json.loads(text)
    except ValueError as e:
        raise VerifierError(f"{where}, but it is not JSON ({e})") from None
    if not isinstance(data, dict) or not data:
        raise VerifierError(f"{where}, but it is not a JSON object of numbers")
    values: dict[str, float] = {}
    for key, value in data.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise VerifierError(f"{where}, but its {key!r} is {value!r}, not a number")
        values[str(key)] = _finite(float(value), where)
    if "reward" in values:
        main = values["reward"]
    else:
        main = sum(values.values()) / len(values)
    return Verdict(main, {k: v for k, v in values.items() if k != "reward"})


def _finite(value: float, where: str) -> float:
    if not math.isfinite(value):
        raise VerifierError(f"{where}, but its reward is {value}")
    return value


def _load_all(folders: list[Path], skip_unsupported: bool) -> dict[str, HarborTask]:
    tasks: dict[str, HarborTask] = {}
    refused: list[str] = []
    for folder in folders:
        try:
            task = load_task(folder)
        except UnsupportedEnvironment as e:
            refused.append(str(e))
            continue
        tasks[str(folder.resolve())] = task
    if refused and (not skip_unsupported or not tasks):
        more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
        hint = "" if skip_unsupported else "; pass skip_unsupported=True to leave such tasks out"
        raise UnsupportedEnvironment(f"{refused[0]}{more}{hint}")
    if not tasks:
        raise EnvLoadError(f"no Harbor task in {folders}")
    return tasks


def _solution_policy(
    solutions: dict[str, dict[str, bytes]], variables: dict[str, dict[str, str]]
) -> Any:
    """Copy the solution in with ``create``, run ``solve.sh`` with ``bash`` (and the task's
    ``[solution] env``), then answer."""

    def solve(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
        instruction = next(m.content for m in messages if m.role == "user") or ""
        if instruction not in solutions:  # not a task of ours: just answer
            return "Done."
        files = sorted(solutions[instruction].items())
        done = sum(m.role == "assistant" for m in messages)
        if done < len(files):
            name, data = files[done]
            args = {"path": f"{SOLUTION_DIR}/{name}", "file_text": data.decode("utf-8")}
            return _call("create", args)
        if done == len(files):
            assign = "".join(
                f"{k}={shlex.quote(v)} " for k, v in variables.get(instruction, {}).items()
            )
            return _call("bash", {"command": f"{assign}bash {SOLUTION_DIR}/solve.sh"})
        return "Done."

    return solve


def _call(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@dataclass(frozen=True)
class TaskCheck:
    """One task's solution check: its reward with the solution and with none."""

    name: str
    solved: float | None
    """Reward with ``solution/solve.sh`` run (``None``: the task has no solution)."""
    unsolved: float
    """Reward with nothing done."""
    error: str = ""

    @property
    def passed(self) -> bool:
        """The solution scores 1 and doing nothing scores below 1."""
        return not self.error and self.solved == 1.0 and self.unsolved < 1.0


def check_tasks(path: str | Path, **kwargs: Any) -> list[TaskCheck]:
    """:func:`check_task` on every task of a task folder (or folder of them), one by one.

    Raises:
        EnvLoadError: A malformed task folder; UnsupportedEnvironment: one that cannot run here.
    """
    from envhub._async import run_sync

    with HarborEnv(path, **kwargs) as env:
        return [run_sync(check_task(env, key)) for key in env.tasks]


async def check_task(env: HarborEnv, key: str) -> TaskCheck:
    """Run a task's verifier after its solution, and after nothing, each in a fresh session."""
    task = env.tasks[key]
    row = {"info": {"id": key}}
    try:
        unsolved = await _verify_fresh(env, row, solution=None)
        solved = None
        if task.solution is not None:
            solved = await _verify_fresh(env, row, solution=task.solution)
    except (VerifierError, UnsupportedEnvironment, OSError) as e:
        return TaskCheck(task.name, None, 0.0, f"{type(e).__name__}: {e}")
    error = "" if task.solution is not None else f"{task.path / 'solution' / 'solve.sh'} is missing"
    return TaskCheck(task.name, solved, unsolved, error)


async def _verify_fresh(
    env: HarborEnv, row: dict[str, Any], solution: dict[str, bytes] | None
) -> float:
    from envhub.workspace_env import default_sandbox

    sandbox = env.sandbox or default_sandbox()
    variables, task = env.command_env(row), env.task_of(row)
    workspace = await env.prepare_workspace(row)
    async with sandbox.session(workspace, limits=env.limits_for(row)) as session:
        if solution is not None:
            for name, data in solution.items():
                await session.write_file(f"{SOLUTION_DIR}/{name}", data)
            await session.arun(["chmod", "-R", "a+x", SOLUTION_DIR])
            await session.arun(
                ["bash", f"{SOLUTION_DIR}/solve.sh"],
                env={**variables, **task.resources.solution_env},
                wall_time=task.resources.agent_timeout or env.limits.wall_time,
            )
            await session.arun(["rm", "-rf", HARBOR_DIR])
        verdict = await run_verifier(session, task, variables)
    return verdict.reward
