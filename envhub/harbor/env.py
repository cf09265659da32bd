"""Harbor task folders as an env: :class:`HarborEnv`, and the solution check.

``envhub.make("path/to/task")`` (one task folder) or ``envhub.make("path/to/tasks")`` (a
folder of them) gives a :class:`HarborEnv`. An episode: the instruction is the prompt, the
workspace holds the files the task's Dockerfile copies (:mod:`envhub.harbor.task`) and what its
``RUN`` steps made (run once per task, before its first episode: :mod:`envhub.harbor.build`),
and the model works with the terminal tools. The session shows the task's paths where it
expects them (the working folder at ``/app`` too, ``/tests``, ``/solution``, ``/logs``; the
model's commands start in ``/app`` and its file tools take ``/app`` paths), or, on a backend
that cannot, they are mapped into ``/sandbox`` (:mod:`envhub.harbor.layout`). When the
episode ends, every process the model left is killed, the tests' and logs' folders are emptied
(``/tmp`` is cleared of test-runner configuration too), ``tests/`` is copied in and ``test.sh``
runs in the session, in the working folder, with the verifier's timeout, the task's variables
and no Python user site (the model's home is the workspace); the reward is what it wrote, as
Harbor reads it:

- ``reward.json`` first: a JSON object of numbers; the reward is its ``"reward"`` key, or its
  only value, else the mean of its values (every key is also reported as a weight-0
  component);
- else ``reward.txt``: one number.

A CTRF report beside it (``ctrf.json``, as pytest-json-ctrf writes it) adds the components
``tests_passed`` (the fraction of its tests that passed) and ``tests`` (how many ran). On a
container back end the tests' downloads (the uv installer, ``uvx --with pytest...``,
``apt-get install curl``) are answered offline by the verifier toolchain
(:mod:`envhub.harbor.toolchain`).

Rewards must lie in [0, 1] (binary or partial). A test script that leaves neither file, an
empty or malformed one, scores 0 and records a :class:`~envhub.errors.VerifierError` with the
end of its output; a session that breaks records an infrastructure error.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import math
import posixpath
import shlex
from pathlib import Path
from typing import Any

from envhub.errors import EnvLoadError, VerifierError
from envhub.harbor.build import prepare, prepared
from envhub.harbor.dockerfile import UnsupportedEnvironment
from envhub.harbor.images import TaskImage, build_task_image, check_image_map, sandbox_named
from envhub.harbor.layout import Layout, layout_for
from envhub.harbor.task import (
    HarborTask,
    find_task_folders,
    load_task,
    rewrite_bytes,
    rewrite_paths,
    rewrite_values,
)
from envhub.harbor.toolchain import MOUNT, toolchain_for
from envhub.sandbox.base import WORKDIR, ExecResult, Limits, Sandbox
from envhub.sandbox.session import Session, Workspace
from envhub.state import State
from envhub.tools.prompt import tool_call_block
from envhub.tools.terminal import in_folder
from envhub.types import Message, system, user
from envhub.workspace_env import (
    WORKSPACE_PROMPT,
    Verdict,
    WorkspaceEnv,
    default_sandbox,
    workspace_prompt,
)

UNCAPPED_FILE_MB = 1 << 30
"""The file-size limit of a task's own container: 1 PiB, none in practice."""


class HarborEnv(WorkspaceEnv):
    """The tasks of a Harbor task folder (or of a folder of task folders).

    Args:
        path: A task folder, a folder whose subfolders are tasks, or a Harbor registry file
            (``registry.json``, ``registry.json:NAME@VERSION``: :mod:`envhub.harbor.registry`).
        skip_unsupported: Leave out tasks whose environment cannot run here (else they are
            refused, with the image named).
        sandbox: Where episodes run: a back end, or its name (``local``, ``e2b``;
            ``container``, ``podman`` or ``docker`` run each task in its own image:
            :mod:`envhub.harbor.images`). Default: the local (bubblewrap) sandbox.
        image_map: With a container back end: base images to replace (``{"ubuntu:24.04":
            "localhost/envhub-base:bookworm"}``), each replacement named in the results.
        **kwargs: See :class:`~envhub.workspace_env.WorkspaceEnv`.

    Raises:
        EnvLoadError: A malformed task folder (the message names the file).
        UnsupportedEnvironment: A task needs a container build (and not ``skip_unsupported``),
            or no task can run here.
    """

    name = "harbor"
    version = "0.1.0"
    system_prompt = WORKSPACE_PROMPT

    def __init__(
        self,
        path: str | Path,
        *,
        skip_unsupported: bool = False,
        sandbox: Sandbox | str | None = None,
        image_map: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        self.path = Path(path)
        kwargs["sandbox"] = sandbox_named(sandbox)
        self.in_container = getattr(kwargs["sandbox"], "backend", None) == "container"
        """Whether each task runs in its own image (a container back end)."""
        self.image_map = check_image_map(image_map)
        self.images: dict[str, TaskImage] = {}
        """The image of each task whose episodes have started (container back end), by key."""
        self.toolchains: dict[str, Path | None] = {}
        """The verifier toolchain each of those tasks' sessions mount (``None``: its tests
        fetch nothing): :mod:`envhub.harbor.toolchain`."""
        found = _task_folders(str(path))
        self.tasks = _load_all(found, skip_unsupported, self.in_container)
        rows = [
            {"question": t.instruction, "info": {"id": key, "name": t.name}}
            for key, t in self.tasks.items()
        ]
        super().__init__(rows, **kwargs)
        complete = all(t.solution for t in self.tasks.values())
        instructions = {t.instruction for t in self.tasks.values()}
        # The policy knows a task by its instruction: two tasks with one instruction, no policy.
        unique = len(instructions) == len(self.tasks)
        self.reference_policy = (
            _solution_policy(self) if complete and unique and self.max_turns >= 3 else None
        )

    def task_of(self, task: dict[str, Any]) -> HarborTask:
        """The Harbor task of a dataset row."""
        return self.tasks[task["info"]["id"]]

    def task_key(self, task: dict[str, Any]) -> str:
        """The task folder's path."""
        return str(task["info"]["id"])

    def layout(self, task: dict[str, Any], sandbox: Sandbox | None = None) -> Layout:
        """Where the task's Harbor paths are in sessions of ``sandbox`` (default: the env's):
        shown at their own place, or mapped (:mod:`envhub.harbor.layout`)."""
        return layout_for(self.task_of(task).workdir, sandbox or self.sandbox or default_sandbox())

    def format_prompt(self, task: dict[str, Any]) -> list[Message]:
        """The system prompt, which names the task's working folder as the current one when
        the session shows it (:func:`~envhub.workspace_env.workspace_prompt`, or a sentence
        after a prompt of the caller's), and the instruction as the task wrote it (its paths
        mapped on a backend that cannot show them)."""
        layout = self.layout(task)
        head = self.instructions
        if head == WORKSPACE_PROMPT:
            head = workspace_prompt(layout.workdir)
        elif head and layout.workdir != WORKDIR:
            head += SAME_FOLDER.format(workdir=layout.workdir)
        instruction = rewrite_paths(self.task_of(task).instruction, layout.mapping)
        return [*([system(head)] if head else []), user(instruction)]

    def session_for(self, sandbox: Sandbox, workspace: Workspace, task: dict[str, Any]) -> Session:
        """A session showing the task's paths where it expects them, when ``sandbox`` can; in
        a container of the task's image on a container back end (after
        :meth:`prepare_workspace`)."""
        paths = self.layout(task, sandbox).paths
        if self.in_container:
            key = self.task_key(task)
            toolchain = self.toolchains.get(key)
            volumes = {str(toolchain): MOUNT} if toolchain else {}
            runs_in = sandbox.with_image(self.images[key].tag, volumes=volumes)  # type: ignore[attr-defined]
            return runs_in.session(None, limits=self.limits_for(task), paths=paths)
        return sandbox.session(workspace, limits=self.limits_for(task), paths=paths)

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
        if self.in_container:
            await self.task_image(task)
        if harbor.build is None:
            return self.workspace_for(task)
        variables = super().command_env(task)  # the Dockerfile's ENV: each step its own
        return await prepare(harbor.build, self.sandbox, self.limits_for(task), variables)

    async def task_image(self, task: dict[str, Any]) -> TaskImage:
        """The image of ``task``'s episodes on a container back end, built once (in a worker
        thread: a build can take minutes), and the verifier toolchain its tests need.

        Raises:
            UnsupportedEnvironment: The tests need what the toolchain cannot give offline.
        """
        key = self.task_key(task)
        if key not in self.images:
            harbor, sandbox = self.task_of(task), self.sandbox
            build = functools.partial(build_task_image, harbor, sandbox, self.image_map)
            image = await asyncio.to_thread(build)
            prepare = functools.partial(toolchain_for, harbor, sandbox, image.tag)
            self.toolchains[key] = await asyncio.to_thread(prepare)
            self.images[key] = image
        return self.images[key]

    def toolchain_mount(self, task: dict[str, Any]) -> str | None:
        """Where the task's sessions show the verifier toolchain (``None``: not mounted)."""
        return MOUNT if self.toolchains.get(self.task_key(task)) else None

    async def setup_state(self, state: State) -> None:
        """Prepare the task's workspace (once per task), then open the episode's session; on
        a container back end the episode's task row names its image (``info["image"]``, with
        any stand-in), which the trajectory records."""
        await self.prepare_workspace(state.task)
        if self.in_container:
            image = self.images[self.task_key(state.task)].describe()
            state.task = {**state.task, "info": {**state.task.get("info", {}), "image": image}}
        await super().setup_state(state)

    def command_env(self, task: dict[str, Any]) -> dict[str, str]:
        """The Dockerfile's ``ENV`` variables (their paths mapped where the session does not
        show them), over the default ones."""
        if self.in_container:
            return {}  # the image's own ENV is the container's
        variables = rewrite_values(self.task_of(task).env, self.layout(task).mapping)
        return {**super().command_env(task), **variables}

    def workdir_for(self, task: dict[str, Any]) -> str:
        """The task's working folder where the session shows it (``/app``), else
        ``/sandbox``: the model's commands start there, as in Harbor's container."""
        return self.layout(task).workdir

    def limits_for(self, task: dict[str, Any]) -> Limits:
        """The env's limits with the task's memory and storage (``task.toml``), files as large
        as the storage, and no command longer than the agent's timeout (see
        :mod:`envhub.harbor.resources`)."""
        resources = self.task_of(task).resources
        changes: dict[str, Any] = {}
        if resources.memory_mb is not None:
            changes["memory_mb"] = resources.memory_mb
        if resources.storage_mb is not None:
            changes["disk_mb"] = resources.storage_mb
        if resources.agent_timeout is not None:
            changes["wall_time"] = min(self.limits.wall_time, resources.agent_timeout)
        # Harbor caps no file (a published verifier unpacks scipy's 30 MB wheel; a test makes a
        # sparse file larger than the disk): none in the task's own container, and one as large
        # as the disk where the session is a sandbox of this machine's.
        disk = changes.get("disk_mb", self.limits.disk_mb)
        files = UNCAPPED_FILE_MB if self.in_container else disk
        changes["file_size_mb"] = max(self.limits.file_size_mb, files)
        return self.limits.with_(**changes)

    def time_limit(self, task: dict[str, Any]) -> float | None:
        """The task's ``[agent] timeout_sec``."""
        return self.task_of(task).resources.agent_timeout

    async def verify(self, session: Session, state: State) -> Verdict:
        """Kill what the model left running, run ``tests/test.sh``, read the reward."""
        task = state.task
        harbor, layout = self.task_of(task), self.layout(task)
        toolchain = self.toolchain_mount(task)
        return await run_verifier(session, harbor, self.command_env(task), layout, toolchain)


async def run_verifier(
    session: Session,
    task: HarborTask,
    env: dict[str, str],
    layout: Layout,
    toolchain: str | None = None,
) -> Verdict:
    """Run a task's tests in ``session`` (laid out as ``layout``) and read the reward they
    wrote; ``toolchain``: where the session shows the verifier toolchain, whose commands come
    first on the tests' ``PATH`` (:mod:`envhub.harbor.toolchain`).

    Raises:
        VerifierError: The tests' folders could not be emptied, no reward file, or a malformed
            one (with the script's output's end).
    """
    await session.akill_processes()
    cleared = await session.arun(["/bin/sh", "-c", _CLEAR, "sh", *layout.fresh])
    if not cleared.ok:
        raise VerifierError(f"could not empty {', '.join(layout.fresh)}: {cleared.describe()}")
    await _copy_tests(session, task, layout)
    command = in_folder(layout.workdir, ["bash", f"{layout.tests}/test.sh"])
    if toolchain is not None:
        command = ["/bin/sh", "-c", _WITH_TOOLCHAIN.format(toolchain), "sh", *command]
        env = {**env, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": f"{toolchain}/wheels"}
    result = await session.arun(
        command,
        wall_time=task.verifier_timeout,
        env={**env, **task.verifier_env, "PYTHONNOUSERSITE": "1"},
    )
    return await read_reward(session, task, result, layout.logs)


async def _copy_tests(session: Session, task: HarborTask, layout: Layout) -> None:
    """Clear ``/tmp``'s test-runner configuration, copy ``tests/`` in (executable, as Harbor
    copies them) and make the logs' folder: one call with the files as a tar on its stdin (each
    call into a container costs an engine ``exec``), or a call per file where the session has
    no ``tar``."""
    files = {name: rewrite_bytes(data, layout.mapping) for name, data in task.tests.items()}
    result = await session.arun(
        ["/bin/sh", "-c", _PREPARE, "sh", layout.tests, layout.logs, *RUNNER_CONFIGS],
        stdin=_tar(files),
    )
    if result.ok:
        return
    if result.exit_code != _NO_TAR:
        raise VerifierError(f"could not copy the tests in: {result.describe()}: {result.stderr}")
    await session.arun(["/bin/sh", "-c", _CLEAR_TMP, "sh", *RUNNER_CONFIGS])
    for name, data in files.items():
        await put_file(session, f"{layout.tests}/{name}", data)
    await session.arun(["chmod", "-R", "a+x", layout.tests])
    await session.arun(["mkdir", "-p", layout.logs])


def _tar(files: dict[str, bytes]) -> bytes:
    """``files`` (relative path -> bytes) as an uncompressed tar."""
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, data in sorted(files.items()):
            member = tarfile.TarInfo(name)
            member.size, member.mode = len(data), 0o755
            archive.addfile(member, io.BytesIO(data))
    return buffer.getvalue()


def _tail(result: ExecResult) -> str:
    """The end of a command's output (stdout, then stderr)."""
    return (result.stdout + result.stderr).strip()[-500:]


async def read_reward(session: Session, task: HarborTask, result: ExecResult, logs: str) -> Verdict:
    """The reward ``test.sh`` wrote in ``logs`` (Harbor's ``/logs/verifier``):
    ``reward.json`` first, else ``reward.txt``.

    Raises:
        VerifierError: Neither file, or one that does not hold a reward in [0, 1].
    """
    where = task.path / "tests" / "test.sh"
    for name, parse in (("reward.json", _json_reward), ("reward.txt", _text_reward)):
        text = await _get(session, f"{logs}/{name}")
        if text is None:
            continue
        verdict = parse(text, f"{where} wrote {name}")
        if not 0.0 <= verdict.reward <= 1.0:
            raise VerifierError(f"{where} wrote {name} with reward {verdict.reward}, not in [0, 1]")
        ctrf = ctrf_components(await _get(session, f"{logs}/ctrf.json"))
        return Verdict(verdict.reward, {**ctrf, **verdict.components}, _tail(result))
    tail = _tail(result)
    raise VerifierError(
        f"{where} wrote no reward ({result.describe()}): it must write /logs/verifier/reward.txt "
        f"or reward.json. Its output ended with: {tail or '(nothing)'}"
    )


SAME_FOLDER = (
    "\n\nThe current folder is the task's working folder, {workdir}: commands start there, and "
    "it is the same folder as /sandbox ({workdir}/x is /sandbox/x)."
)
"""Added to a system prompt of the caller's when the session shows the working folder at its
own path."""
RUNNER_CONFIGS = (
    "pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg", "setup.py",
    "conftest.py", "__init__.py",
)  # fmt: skip
"""Files a test runner reads from the folders above its tests: taken out of ``/tmp``."""
# Each folder emptied: made readable first (the model may have locked it), removed (a link
# with it; a mount point stays), made again, then checked empty.
_CLEAR = (
    'for d in "$@"; do if [ -d "$d" ] && [ ! -L "$d" ]; then chmod -R u+rwx -- "$d"; fi; '
    'rm -rf -- "$d" 2>/dev/null; mkdir -p -- "$d" && left=$(ls -A -- "$d") && [ -z "$left" ] '
    "|| exit 1; done"
)
_CLEAR_TMP = 'cd /tmp && rm -rf -- "$@"'
_NO_TAR = 99
_PREPARE = (
    'command -v tar >/dev/null 2>&1 || exit 99; tests=$1 logs=$2; shift 2; '
    '(cd /tmp && rm -rf -- "$@") && mkdir -p -- "$tests" && tar -xf - -C "$tests" '
    '--no-same-owner && chmod -R a+x -- "$tests" && mkdir -p -- "$logs"'
)
_WITH_TOOLCHAIN = 'PATH="{0}/shims:$PATH" exec "$@"'
_PUT = 'mkdir -p -- "$(dirname -- "$1")" && exec cat > "$1"'
_GET = 'if [ -f "$1" ] && [ ! -L "$1" ]; then exec head -c 65536 -- "$1"; fi; exit 102'


async def put_file(session: Session, path: str, data: bytes) -> None:
    """Write a file anywhere the session may (``write_file`` keeps to ``/sandbox``)."""
    result = await session.arun(["/bin/sh", "-c", _PUT, "sh", path], stdin=data)
    if not result.ok:
        raise VerifierError(f"could not write {path} in the session: {result.describe()}")


async def _get(session: Session, path: str) -> str | None:
    """A regular file's text (its first 64 KiB), or ``None`` when there is none."""
    result = await session.arun(["/bin/sh", "-c", _GET, "sh", path])
    return result.stdout if result.ok else None


def ctrf_components(text: str | None) -> dict[str, float]:
    """A CTRF report's (``ctrf.json``, pytest-json-ctrf's) summary as reward components:
    ``tests_passed``, the fraction of its tests that passed, and ``tests``, how many ran
    (none when there is no report, or it is malformed)."""
    try:
        summary = json.loads(text or "")["results"]["summary"]
        total, passed = int(summary["tests"]), int(summary["passed"])
    except (ValueError, TypeError, KeyError):
        return {}
    if total <= 0:
        return {}
    return {"tests_passed": passed / total, "tests": float(total)}


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


def _task_folders(path: str) -> list[Path]:
    """The task folders of a task folder, a folder of them, or a registry file's dataset."""
    from envhub.harbor.registry import read_dataset, split_reference

    if split_reference(path) is not None:
        return list(read_dataset(path).folders)
    return find_task_folders(path)


def _load_all(
    folders: list[Path], skip_unsupported: bool, in_container: bool
) -> dict[str, HarborTask]:
    tasks: dict[str, HarborTask] = {}
    refused: list[str] = []
    for folder in folders:
        try:
            task = load_task(folder, in_container=in_container)
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


def _solution_policy(env: HarborEnv) -> Any:
    """Write the task's ``solution/`` into its solution folder with one ``bash`` call, run
    ``solve.sh`` with another (in the working folder, where the model's commands start, with
    the task's ``[solution] env``), then answer. The task is the one whose prompt holds the
    conversation's instruction."""

    def solve(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
        instruction = next(m.content for m in messages if m.role == "user") or ""
        rows = ({"info": {"id": key}} for key in env.tasks)
        row = next((r for r in rows if env.format_prompt(r)[-1].content == instruction), None)
        if row is None:  # not a task of ours: just answer
            return "Done."
        task, layout = env.task_of(row), env.layout(row)
        done = sum(m.role == "assistant" for m in messages)
        if done == 0:
            files = {n: rewrite_bytes(d, layout.mapping) for n, d in (task.solution or {}).items()}
            return tool_call_block("bash", {"command": _write_files(layout.solution, files)})
        if done == 1:
            variables = task.resources.solution_env.items()
            assign = "".join(f"{k}={shlex.quote(v)} " for k, v in variables)
            solution = shlex.quote(layout.solution)
            run = f"chmod -R a+x {solution} && {assign}bash {solution}/solve.sh"
            return tool_call_block("bash", {"command": run})
        return "Done."

    return solve


def _write_files(folder: str, files: dict[str, bytes]) -> str:
    """A shell script writing ``files`` (relative paths) under ``folder``, bytes exact."""
    steps = ["set -e"]
    for name, data in sorted(files.items()):
        path = posixpath.join(folder, name)
        encoded = base64.encodebytes(data).decode()  # "_" is no base64 letter: the end is found
        steps.append(f"mkdir -p {shlex.quote(posixpath.dirname(path))}")
        steps.append(f"base64 -d > {shlex.quote(path)} <<'_EOF_'\n{encoded}_EOF_")
    return "\n".join(steps)
