"""``envhub check`` on Harbor tasks: each task's tests after its solution (which must score 1)
and after nothing (which must score below 1), each in a fresh session of the task."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envhub.errors import SandboxError, VerifierError
from envhub.harbor.dockerfile import UnsupportedEnvironment
from envhub.harbor.env import HarborEnv
from envhub.harbor.layout import HARBOR_DIR
from envhub.harbor.task import rewrite_bytes
from envhub.harbor.verifier import put_file
from envhub.tools.terminal import in_folder
from envhub.workspace_env import Verdict, default_sandbox


@dataclass(frozen=True)
class TaskCheck:
    """One task's solution check: its reward with the solution and with none."""

    name: str
    solved: float | None
    """Reward with ``solution/solve.sh`` run (``None``: the task has no solution)."""
    unsolved: float | None
    """Reward with nothing done (``None``: that run failed, see :attr:`error`)."""
    error: str = ""
    image: str = ""
    """The image it ran in, with any stand-in (a container back end; empty otherwise)."""

    @property
    def passed(self) -> bool:
        """The solution scores 1 and doing nothing scores below 1."""
        return (
            not self.error and self.solved == 1.0
            and self.unsolved is not None and self.unsolved < 1.0
        )  # fmt: skip


def check_tasks(path: str | Path, **kwargs: Any) -> list[TaskCheck]:
    """:func:`check_task` on every task of a task folder (or folder of them), one by one.

    Raises:
        EnvLoadError: A malformed task folder; UnsupportedEnvironment: one that cannot run here.
    """
    from envhub._async import run_sync

    with HarborEnv(path, **kwargs) as env:
        return [run_sync(check_task(env, key)) for key in env.tasks]


async def check_task(env: HarborEnv, key: str) -> TaskCheck:
    """Run a task's verifier after nothing, then after its solution, each in a fresh session.
    A task that cannot be prepared (its image does not build) is reported once; otherwise a
    failed run is recorded and the other still runs (a verifier that times out with nothing
    done says nothing about the solution). A solution scoring below 1 is reported with the
    end of what the tests printed."""
    task = env.tasks[key]
    row = {"info": {"id": key}}
    try:
        await env.prepare_workspace(row)
    except (UnsupportedEnvironment, SandboxError, OSError) as e:
        return TaskCheck(task.name, None, None, f"{type(e).__name__}: {e}", _image_of(env, key))
    errors: list[str] = []
    unsolved = await _attempt(env, row, None, errors)
    solved = None
    if task.solution is None:
        errors.append(f"{task.path / 'solution' / 'solve.sh'} is missing")
    else:
        solved = await _attempt(env, row, task.solution, errors)
    return TaskCheck(task.name, solved, unsolved, "; ".join(errors), _image_of(env, key))


async def _attempt(
    env: HarborEnv, row: dict[str, Any], solution: dict[str, bytes] | None, errors: list[str]
) -> float | None:
    """:func:`_verify_fresh`'s reward, or ``None`` with the failure added to ``errors`` (and,
    with the solution, a reward below 1 with what the tests printed)."""
    which = "" if solution is None else "with its solution: "
    try:
        verdict = await _verify_fresh(env, row, solution)
    except (VerifierError, UnsupportedEnvironment, SandboxError, OSError) as e:
        errors.append(f"{type(e).__name__}: {which}{e}")
        return None
    if solution is not None and verdict.reward < 1.0:
        said = verdict.output or "(nothing)"
        errors.append(f"{which}reward {verdict.reward:g}; the tests' output ended with: {said}")
    return verdict.reward


def _image_of(env: HarborEnv, key: str) -> str:
    return env.image_description({"info": {"id": key}})


async def _verify_fresh(
    env: HarborEnv, row: dict[str, Any], solution: dict[str, bytes] | None
) -> Verdict:
    sandbox = env.sandbox or default_sandbox()
    variables, task, layout = env.command_env(row), env.task_of(row), env.layout(row, sandbox)
    workspace = await env.prepare_workspace(row)
    async with env.session_for(sandbox, workspace, row) as session:
        if solution is not None:
            for name, data in solution.items():
                data = rewrite_bytes(data, layout.mapping)
                await put_file(session, f"{layout.solution}/{name}", data)
            await session.arun(["chmod", "-R", "a+x", layout.solution])
            await session.arun(
                in_folder(layout.workdir, ["bash", f"{layout.solution}/solve.sh"]),
                env={**variables, **task.resources.solution_env},
                wall_time=task.resources.agent_timeout or env.limits.wall_time,
            )
            if not layout.shown:  # a mapped solution lies in the workspace: out before the tests
                await session.arun(["rm", "-rf", HARBOR_DIR])
        return await env.score(session, row)
