"""Reading Harbor task folders: ``task.toml``, ``instruction.md``, ``environment/``, ``tests/``
and an optional ``solution/``.

A task folder becomes a :class:`HarborTask`: the instruction, the files the episode's workspace
starts with, its working folder, the tests and the solution (both kept off the workspace until
they run), and its limits (:mod:`envhub.harbor.resources`: the agent's and the verifier's
timeouts, memory, storage; the verifier's defaults to 600 s as in Harbor). A malformed folder
raises :class:`~envhub.errors.EnvLoadError` naming the file at fault; a task whose environment
cannot run here raises :class:`~envhub.harbor.dockerfile.UnsupportedEnvironment`. A Dockerfile
with ``RUN`` steps gives the task a :attr:`HarborTask.build` (its copies and steps in order, the
working folder's path mapped to ``/sandbox``), which :mod:`envhub.harbor.build` runs once to
prepare the workspace.

**Paths.** The instruction, the tests, the solution and the Dockerfile's ``ENV`` values are
kept as the task wrote them: a session shows the working folder (:attr:`HarborTask.workdir`,
usually ``/app``), ``/tests``, ``/solution`` and ``/logs`` where the task expects them; only a
backend that cannot gets them mapped into ``/sandbox`` and rewritten (:func:`rewrite_paths`),
see :mod:`envhub.harbor.layout`.

The ``task.toml`` fields read: ``[task] name`` (the task's name; else its folder's),
``[metadata]`` (kept), ``[environment] workdir`` (the working folder; a Dockerfile ``WORKDIR``
must agree), ``[environment] docker_image`` (the image when there is no Dockerfile), and the
limits and variables of :mod:`envhub.harbor.resources`.
"""

from __future__ import annotations

import posixpath
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from envhub.errors import EnvLoadError
from envhub.harbor.build import DEFAULT_BUILD_TIMEOUT, Build, CopyStep, RunStep
from envhub.harbor.build_check import check_run
from envhub.harbor.dockerfile import (
    DEFAULT_WORKDIR,
    Environment,
    RunInstruction,
    UnsupportedEnvironment,
    check_image,
    container_environment,
    read_dockerfile,
)
from envhub.harbor.resources import Resources, read_resources
from envhub.harbor.separate import SeparateVerifier, read_separate
from envhub.harbor.verifier_needs import ScriptNeeds, check_offline, read_needs
from envhub.sandbox.base import WORKDIR

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

_MARKERS = ("task.toml", "instruction.md", "tests", "environment", "task.yaml")


@dataclass(frozen=True)
class HarborTask:
    """One Harbor task, read and checked; its texts as the task wrote them."""

    path: Path
    name: str
    instruction: str
    files: dict[str, bytes]
    """The workspace's starting files, relative to the working folder."""
    executables: frozenset[str]
    """Those of :attr:`files` that are executable (a workspace keeps their mode)."""
    tests: dict[str, bytes]
    """``tests/``'s files, relative to it (``test.sh`` among them)."""
    solution: dict[str, bytes] | None
    workdir: str = DEFAULT_WORKDIR
    """The working folder, absolute: where the workspace's files are and commands start."""
    resources: Resources = field(default_factory=Resources)
    """Its limits and the variables of its tests and solution, from ``task.toml``."""
    env: dict[str, str] = field(default_factory=dict)
    """Variables from the Dockerfile's ``ENV`` steps (commands and tests run with them)."""
    metadata: dict[str, Any] = field(default_factory=dict)
    build: Build | None = None
    """The copies and ``RUN`` steps that prepare the workspace, when the Dockerfile has ``RUN``
    steps (:mod:`envhub.harbor.build`); ``None``: the workspace is :attr:`files`."""
    image: str | None = None
    """The image the task names (its Dockerfile's ``FROM``, or ``docker_image``)."""
    context: Path | None = None
    """The folder of its Dockerfile (``None``: ``environment/``)."""
    verifier_needs: ScriptNeeds | None = None
    """What its tests' scripts fetch (read for the container back end, which answers it from
    the verifier toolchain: :mod:`envhub.harbor.toolchain`)."""
    separate: SeparateVerifier | None = None
    """Where its tests run when not in the agent's container (``[verifier] environment_mode =
    "separate"``: :mod:`envhub.harbor.separate`); ``None``: in the episode's session."""

    @property
    def environment_dir(self) -> Path:
        """The folder of its Dockerfile, the build's context."""
        return self.context or self.path / "environment"

    @property
    def verifier_timeout(self) -> float:
        """Seconds ``test.sh`` may run (``[verifier] timeout_sec``)."""
        return self.resources.verifier_timeout

    @property
    def verifier_env(self) -> dict[str, str]:
        """Variables ``test.sh`` runs with (``[verifier] env``)."""
        return self.resources.verifier_env


def is_task_folder(path: Path) -> bool:
    """Whether ``path`` looks like one Harbor task (has any of its files)."""
    return path.is_dir() and any((path / m).exists() for m in _MARKERS)


def find_task_folders(path: str | Path) -> list[Path]:
    """``path`` itself when it is a task folder, else its task subfolders, sorted by name.

    Raises:
        EnvLoadError: ``path`` is no folder, or holds no task folder.
    """
    root = Path(path)
    if not root.is_dir():
        raise EnvLoadError(f"{root} is not a folder (a Harbor task or a folder of tasks)")
    if is_task_folder(root):
        return [root]
    found = sorted(p for p in root.iterdir() if is_task_folder(p))
    if not found:
        raise EnvLoadError(
            f"{root} has no task.toml, and none of its subfolders is a Harbor task "
            "(task.toml, instruction.md, environment/, tests/test.sh)"
        )
    return found


def load_harbor_task(path: str | Path, *, in_container: bool = False) -> HarborTask:
    """Read and check the Harbor task folder (``task.toml``) at ``path``; ``in_container``: for
    the container back end, which builds the task's image itself (its Dockerfile is read only
    for the image and working folder, and nothing in it is refused: :mod:`envhub.harbor.images`).

    Raises:
        EnvLoadError: A required file is missing or malformed (the message names it).
        UnsupportedEnvironment: The task's environment needs a container build (not
            ``in_container``), or several containers.
    """
    folder = Path(path)
    config = _read_config(folder / "task.toml")
    instruction = _read_instruction(folder / "instruction.md")
    tests = _read_tree(folder / "tests")
    if "test.sh" not in tests:
        raise EnvLoadError(f"{folder / 'tests' / 'test.sh'} is missing: a task needs its tests")
    _refuse_compose(folder / "environment")
    separate = read_separate(folder, config, in_container)
    workdir = _workdir(folder / "task.toml", config)
    environment = environment_of(folder, folder / "environment", workdir, in_container, config)
    solution_dir = folder / "solution"
    solution = _read_tree(solution_dir) if solution_dir.is_dir() else None
    if solution is not None and "solve.sh" not in solution:
        raise EnvLoadError(f"{solution_dir / 'solve.sh'} is missing (solution/ has no solve.sh)")
    task_meta = config.get("task") if isinstance(config.get("task"), dict) else {}
    resources = read_resources(folder / "task.toml", config)
    files, executables, build = files_of(
        folder / "environment", environment, resources.build_timeout
    )
    return HarborTask(
        path=folder,
        name=str(task_meta.get("name") or folder.name),
        instruction=instruction,
        files=files,
        executables=executables,
        tests=tests,
        solution=solution,
        workdir=environment.workdir,
        resources=resources,
        env=environment.env,
        metadata=dict(_section(config, "metadata")),
        build=build,
        image=environment.image,
        verifier_needs=verifier_needs(tests, folder / "tests") if in_container else None,
        separate=separate,
    )


def verifier_needs(tests: dict[str, bytes], where: Path) -> ScriptNeeds:
    """What the tests' scripts fetch, for the container back end's offline verifier.

    Raises:
        UnsupportedEnvironment: A line that the verifier toolchain cannot answer offline.
    """
    needs = read_needs(tests, where)
    check_offline(needs)
    return needs


def rewrite_paths(text: str, mapping: dict[str, str]) -> str:
    """Replace each Harbor path of ``mapping`` where it stands as a whole path (``/app`` and
    ``/app/x``, not ``/apple``)."""
    if not mapping:
        return text
    keys = sorted(mapping, key=len, reverse=True)
    pattern = re.compile(
        r"(?<![\w.\-/])(" + "|".join(re.escape(k) for k in keys) + r")(?=/|[^\w.\-]|$)"
    )
    return pattern.sub(lambda m: mapping[m.group(1)], text)


def rewrite_bytes(data: bytes, mapping: dict[str, str]) -> bytes:
    """:func:`rewrite_paths` on a UTF-8 text file; other files come back as they are."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return data
    return rewrite_paths(text, mapping).encode("utf-8")


def rewrite_values(env: dict[str, str], mapping: dict[str, str]) -> dict[str, str]:
    """:func:`rewrite_paths` on each value of ``env``."""
    return {key: rewrite_paths(value, mapping) for key, value in env.items()}


def _read_config(file: Path) -> dict[str, Any]:
    if not file.is_file():
        raise EnvLoadError(f"{file} is missing: a Harbor task needs its task.toml")
    try:
        return tomllib.loads(file.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise EnvLoadError(f"{file} is not valid TOML: {e}") from None


def _read_instruction(file: Path) -> str:
    if not file.is_file():
        raise EnvLoadError(f"{file} is missing: a Harbor task needs its instruction")
    text = file.read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        raise EnvLoadError(f"{file} is empty: write the task's instruction in it")
    return text


def read_tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (but ``__pycache__``), by its path relative to it."""
    return _read_tree(folder)


def _read_tree(folder: Path) -> dict[str, bytes]:
    if not folder.is_dir():
        return {}
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def _section(config: dict[str, Any], name: str) -> dict[str, Any]:
    value = config.get(name, {})
    return value if isinstance(value, dict) else {}


def files_of(
    context: Path, environment: Environment, timeout: float | None
) -> tuple[dict[str, bytes], frozenset[str], Build | None]:
    """The files the Dockerfile copies into the working folder, which are executable, and the
    build of its ``RUN`` steps (see :func:`_build`)."""
    copies = _copied_files(context, environment)
    files = {name: data for copy in copies for name, data in copy.files.items()}
    executables = frozenset().union(*(c.executables for c in copies))
    return files, executables, _build(environment, copies, timeout)


def _refuse_compose(env_dir: Path) -> None:
    for name in ("docker-compose.yaml", "docker-compose.yml"):
        if (env_dir / name).is_file():
            raise UnsupportedEnvironment(
                f"{env_dir / name}: a task of several containers (docker compose) cannot run "
                "here; envhub runs each task in one session (its own image with sandbox=container, "
                "else the host's base system)"
            )


def environment_of(
    folder: Path,
    env_dir: Path,
    workdir: str | None,
    in_container: bool,
    config: dict[str, Any] | None = None,
) -> Environment:
    """The task's environment, from ``env_dir``'s Dockerfile or ``[environment]
    docker_image`` (``config``: ``task.toml``'s), checked unless ``in_container``.

    Raises:
        UnsupportedEnvironment: It cannot run here (see :func:`load_harbor_task`).
    """
    image = _section(config or {}, "environment").get("docker_image")
    if in_container:
        if (env_dir / "Dockerfile").is_file():
            return container_environment(env_dir / "Dockerfile", workdir)
        return Environment(image=str(image) if image else None, workdir=workdir or DEFAULT_WORKDIR)
    if (env_dir / "Dockerfile").is_file():
        environment = read_dockerfile(env_dir / "Dockerfile", workdir or DEFAULT_WORKDIR)
        if workdir is not None and environment.workdir != workdir:
            raise UnsupportedEnvironment(
                f"{folder / 'task.toml'}: [environment] workdir = {workdir!r}, but "
                f"{env_dir / 'Dockerfile'} works in {environment.workdir}: only one working "
                "folder is kept here; make them agree"
            )
        return environment
    if image:
        check_image(str(image), f"{folder / 'task.toml'} [environment] docker_image")
        return Environment(image=str(image), workdir=workdir or DEFAULT_WORKDIR)
    return Environment(workdir=workdir or DEFAULT_WORKDIR)


def _workdir(file: Path, config: dict[str, Any]) -> str | None:
    """``[environment] workdir``, normalized (``None`` when absent).

    Raises:
        EnvLoadError: Not an absolute path.
    """
    value = _section(config, "environment").get("workdir")
    if value is None:
        return None
    if not isinstance(value, str) or not value.startswith("/"):
        raise EnvLoadError(f"{file}: [environment] workdir must be an absolute path, got {value!r}")
    return posixpath.normpath(value)


def _workdir_only(workdir: str) -> dict[str, str]:
    return {} if workdir in ("/", "") else {workdir: WORKDIR}


def _build(environment: Environment, copies: list[CopyStep], timeout: float | None) -> Build | None:
    """The copies and ``RUN`` steps in order, mapped into the sandbox (``None`` without steps).

    Raises:
        UnsupportedEnvironment: A step that cannot run here (see :mod:`envhub.harbor.build_check`).
    """
    if not environment.runs:
        return None
    steps: list[CopyStep | RunStep] = []
    done = 0
    for run in environment.runs:
        check_run(run, environment.workdir)
        steps += copies[done : run.after_copies]
        done = run.after_copies
        steps.append(_run_step(run, environment.workdir))
    steps += copies[done:]
    return Build(tuple(steps), timeout or DEFAULT_BUILD_TIMEOUT)


def _run_step(run: RunInstruction, workdir: str) -> RunStep:
    mapping = _workdir_only(workdir)
    cwd = WORKDIR
    if run.workdir is not None:
        try:
            relative = PurePosixPath(run.workdir).relative_to(workdir)
        except ValueError:
            raise UnsupportedEnvironment(
                f"{run.where}: a RUN step in {run.workdir}, outside the working folder "
                f"{workdir}: only the working folder is kept here; set WORKDIR {workdir} first"
            ) from None
        cwd = str(PurePosixPath(WORKDIR, relative))
    return RunStep(
        where=run.where,
        text=run.text,
        argv=tuple(rewrite_paths(word, mapping) for word in run.argv),
        cwd=cwd,
        env=rewrite_values(run.env, mapping),
    )


def _copied_files(context: Path, environment: Environment) -> list[CopyStep]:
    """The files each of the Dockerfile's copies puts in the working folder, and which of
    them are executable."""
    return [_copy_step(context, source, dest) for source, dest in environment.copies]


def _copy_step(context: Path, source: str, dest: str) -> CopyStep:
    files: dict[str, bytes] = {}
    executable: set[str] = set()
    origin = (context / source).resolve()
    if not origin.is_relative_to(context.resolve()) or not origin.exists():
        raise EnvLoadError(f"{context / 'Dockerfile'}: COPY {source}: no such file in {context}")
    if origin.is_dir():
        pairs = [(_join(dest, rel, dir_dest=True), origin / rel) for rel in _read_tree(origin)]
    else:
        pairs = [(_join(dest, origin.name, dir_dest=dest.endswith("/")), origin)]
    for name, path in pairs:
        files[name] = path.read_bytes()
        if path.stat().st_mode & 0o111:
            executable.add(name)
    return CopyStep(files, frozenset(executable))


def _join(dest: str, name: str, *, dir_dest: bool) -> str:
    base = dest.rstrip("/")
    if base in ("", "."):
        return name
    return f"{base}/{name}" if dir_dest else base
