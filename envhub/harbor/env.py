"""Harbor task folders as an env: :class:`HarborEnv`, and the solution check.

``envhub.make("path/to/task")`` (one task folder) or ``envhub.make("path/to/tasks")`` (a
folder of them) gives a :class:`HarborEnv`. An episode: the instruction is the prompt, the
workspace holds the files the task's Dockerfile copies (:mod:`envhub.harbor.task`) and what its
``RUN`` steps made (run once per task, before its first episode: :mod:`envhub.harbor.build`),
and the model works with the terminal tools. The session shows the task's paths where it
expects them (the working folder at ``/app`` too, ``/tests``, ``/solution``, ``/logs``; the
model's commands start in ``/app`` and its file tools take ``/app`` paths), or, on a backend
that cannot, they are mapped into ``/sandbox`` (:mod:`envhub.harbor.layout`).

When the episode ends, the task's tests score it (:mod:`envhub.harbor.verifier`): in the
episode's session, after every process the model left is killed, except in the task's own
container (a container back end), where what the model or ``solve.sh`` started (a server
behind ``nohup ... &``) lives on until the tests have run, as in Harbor's one container per
trial, and ends with the container; or, for a task whose tests run apart (``[verifier]
environment_mode = "separate"``), in a container of their own given the session's artifacts
(:mod:`envhub.harbor.separate`). ``test.sh`` runs in the working folder, with the verifier's
timeout, the task's variables and no Python user site (the model's home is the workspace). On
a container back end the tests' downloads (the uv installer, ``uvx --with pytest...``,
``apt-get install curl``) are answered offline by the verifier toolchain
(:mod:`envhub.harbor.toolchain`).

A test script that leaves no reward, or a malformed one, scores 0 and records a
:class:`~envhub.errors.VerifierError` with the end of its output; a session that breaks
records an infrastructure error.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import functools
import posixpath
import shlex
from pathlib import Path
from typing import Any

from envhub.errors import EnvLoadError
from envhub.harbor.build import prepare, prepared
from envhub.harbor.dockerfile import UnsupportedEnvironment
from envhub.harbor.images import (
    TaskImage,
    build_task_image,
    build_verifier_image,
    check_image_map,
    sandbox_named,
)
from envhub.harbor.layout import Layout, layout_for
from envhub.harbor.loading import load_task
from envhub.harbor.separate import collect_artifacts, place_artifacts
from envhub.harbor.task import (
    HarborTask,
    find_task_folders,
    rewrite_bytes,
    rewrite_paths,
    rewrite_values,
)
from envhub.harbor.toolchain import MOUNT, toolchain_for
from envhub.harbor.verifier import run_verifier
from envhub.sandbox.base import WORKDIR, Limits, Sandbox
from envhub.sandbox.session import Session, Workspace
from envhub.state import State
from envhub.tools.prompt import tool_call_block
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
        self.verifier_images: dict[str, TaskImage] = {}
        """The image the tests of each such task run in when they run apart
        (:mod:`envhub.harbor.separate`)."""
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
            image = tests_image = await asyncio.to_thread(build)
            if harbor.separate is not None:
                apart = functools.partial(
                    build_verifier_image, harbor, sandbox, self.image_map, image
                )
                tests_image = self.verifier_images[key] = await asyncio.to_thread(apart)
            prepare = functools.partial(toolchain_for, harbor, sandbox, tests_image.tag)
            self.toolchains[key] = await asyncio.to_thread(prepare)
            self.images[key] = image
        return self.images[key]

    def image_description(self, task: dict[str, Any]) -> str:
        """The image a task ran in, with any stand-in, and where its tests ran when apart
        (empty before its image is known)."""
        key = self.task_key(task)
        if key not in self.images:
            return ""
        tests = self.verifier_images.get(key)
        apart = f"; tests apart in {tests.describe()}" if tests is not None else ""
        return self.images[key].describe() + apart

    def toolchain_mount(self, task: dict[str, Any]) -> str | None:
        """Where the task's sessions show the verifier toolchain (``None``: not mounted)."""
        return MOUNT if self.toolchains.get(self.task_key(task)) else None

    async def setup_state(self, state: State) -> None:
        """Prepare the task's workspace (once per task), then open the episode's session; on
        a container back end the episode's task row names its image (``info["image"]``, with
        any stand-in), which the trajectory records."""
        await self.prepare_workspace(state.task)
        if self.in_container:
            image = self.image_description(state.task)
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
        """Run the task's tests on the episode's session (:meth:`score`)."""
        return await self.score(session, state.task)

    async def score(self, session: Session, task: dict[str, Any]) -> Verdict:
        """Run ``tests/test.sh`` and read the reward: in ``session`` (after what the model
        left running is killed, but in the task's own container, where it lives on as in
        Harbor's), or, for a task whose tests run apart, in a container of their own given
        the session's artifacts (:mod:`envhub.harbor.separate`)."""
        harbor, layout = self.task_of(task), self.layout(task)
        toolchain = self.toolchain_mount(task)
        if harbor.separate is None:
            env, kill = self.command_env(task), not self.in_container
            return await run_verifier(session, harbor, env, layout, toolchain, kill=kill)
        cap = max(self.limits_for(task).disk_mb, 1) << 20
        artifacts = await collect_artifacts(session, harbor.separate, harbor.workdir, cap)
        await session.akill_processes()  # Harbor stops the agent's container here
        async with self.verifier_session(task) as checker:
            await place_artifacts(checker, artifacts)
            bundled = harbor.separate.bundled
            apart = self.verifier_layout(task)
            return await run_verifier(checker, harbor, {}, apart, toolchain, copy_tests=not bundled)

    def verifier_layout(self, task: dict[str, Any]) -> Layout:
        """Where a task's paths are in the container its tests run in apart: its image's
        working folder; ``/tests`` the image's own when it holds the tests."""
        separate = self.task_of(task).separate
        assert separate is not None and self.sandbox is not None
        if not separate.bundled:
            return dataclasses.replace(self.layout(task), fresh=("/tests", "/logs/verifier"))
        layout = layout_for(separate.workdir, self.sandbox)
        paths = dataclasses.replace(layout.paths, folders=("/logs",))
        return dataclasses.replace(layout, fresh=("/logs/verifier",), paths=paths)

    def verifier_session(self, task: dict[str, Any]) -> Session:
        """A fresh container of the image a task's tests run in apart, with the task's
        limits (after :meth:`prepare_workspace`)."""
        key = self.task_key(task)
        toolchain = self.toolchains.get(key)
        volumes = {str(toolchain): MOUNT} if toolchain else {}
        runs_in = self.sandbox.with_image(self.verifier_images[key].tag, volumes=volumes)  # type: ignore[union-attr]
        paths = self.verifier_layout(task).paths
        return runs_in.session(None, limits=self.limits_for(task), paths=paths)


SAME_FOLDER = (
    "\n\nThe current folder is the task's working folder, {workdir}: commands start there, and "
    "it is the same folder as /sandbox ({workdir}/x is /sandbox/x)."
)
"""Added to a system prompt of the caller's when the session shows the working folder at its
own path."""


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
