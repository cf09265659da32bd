"""Reading Harbor task folders: ``task.toml``, ``instruction.md``, ``environment/``, ``tests/``
and an optional ``solution/``.

A task folder becomes a :class:`HarborTask`: the instruction, the files the episode's workspace
starts with, the tests and the solution (both kept off the workspace until they run), and its
limits (:mod:`envhub.harbor.resources`: the agent's and the verifier's timeouts, memory,
storage; the verifier's defaults to 600 s as in Harbor). A malformed folder
raises :class:`~envhub.errors.EnvLoadError` naming the file at fault; a task whose environment
cannot run here raises :class:`~envhub.harbor.dockerfile.UnsupportedEnvironment`. A Dockerfile
with ``RUN`` steps gives the task a :attr:`HarborTask.build` (its copies and steps in order,
paths mapped as below), which :mod:`envhub.harbor.build` runs once to prepare the workspace.

**Paths.** Harbor's container has the task at its working folder (the Dockerfile's
``WORKDIR``, usually ``/app``), the tests at ``/tests``, the solution at ``/solution`` and the
reward at ``/logs/verifier``. A sandbox session has two writable folders, ``/sandbox`` and
``/tmp``, so envhub maps them there: the working folder is ``/sandbox``, the solution
``/sandbox/.harbor/solution`` (the reference policy writes it with the model's tools), the
tests and the reward ``/tmp/.harbor/tests`` and ``/tmp/.harbor/logs/verifier``
(:data:`VERIFIER_DIR`; ``/sandbox/.harbor`` on a backend whose ``/tmp`` does not last the
session). Those absolute paths are rewritten in the instruction and in the text files of
``tests/`` and ``solution/`` (:func:`rewrite_paths`; the tests' when they run). The tests and
the solution are copied in only when they run, after the episode, as Harbor uploads them.

The tests stay out of ``/sandbox`` for the reason Harbor keeps ``/tests`` out of ``/app``: a
test runner reads configuration from the folders above its tests (pytest: ``pytest.ini``,
``pyproject.toml``, ``conftest.py``, ...), and the workspace is the model's to write. Above
``/tmp/.harbor`` there is only ``/tmp``, which the verifier clears of such files first, and the
read-only ``/``.
"""

from __future__ import annotations

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
    read_dockerfile,
)
from envhub.harbor.resources import Resources, read_resources
from envhub.sandbox.base import WORKDIR

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

HARBOR_DIR = f"{WORKDIR}/.harbor"
"""Where the solution goes, in the workspace."""
SOLUTION_DIR = f"{HARBOR_DIR}/solution"
VERIFIER_DIR = "/tmp/.harbor"
"""Where the tests and the reward go, out of the workspace (made afresh for each verifier)."""
TESTS_DIR = f"{VERIFIER_DIR}/tests"
VERIFIER_LOGS = f"{VERIFIER_DIR}/logs/verifier"
_MARKERS = ("task.toml", "instruction.md", "tests", "environment")


@dataclass(frozen=True)
class HarborTask:
    """One Harbor task, read and checked; paths already mapped into the sandbox."""

    path: Path
    name: str
    instruction: str
    files: dict[str, bytes]
    """The workspace's starting files, relative to the working folder."""
    executables: frozenset[str]
    """Those of :attr:`files` that are executable (a workspace keeps their mode)."""
    tests: dict[str, bytes]
    """``tests/``'s files, relative to it (``test.sh`` among them); their ``/tests`` and
    ``/logs/verifier`` are mapped when they run (:func:`verifier_paths`)."""
    solution: dict[str, bytes] | None
    resources: Resources = field(default_factory=Resources)
    """Its limits and the variables of its tests and solution, from ``task.toml``."""
    env: dict[str, str] = field(default_factory=dict)
    """Variables from the Dockerfile's ``ENV`` steps (commands and tests run with them)."""
    metadata: dict[str, Any] = field(default_factory=dict)
    build: Build | None = None
    """The copies and ``RUN`` steps that prepare the workspace, when the Dockerfile has ``RUN``
    steps (:mod:`envhub.harbor.build`); ``None``: the workspace is :attr:`files`."""

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


def load_task(path: str | Path) -> HarborTask:
    """Read and check the task folder at ``path``.

    Raises:
        EnvLoadError: A required file is missing or malformed (the message names it).
        UnsupportedEnvironment: The task's environment needs a container build.
    """
    folder = Path(path)
    config = _read_config(folder / "task.toml")
    instruction = _read_instruction(folder / "instruction.md")
    tests = _read_tree(folder / "tests")
    if "test.sh" not in tests:
        raise EnvLoadError(f"{folder / 'tests' / 'test.sh'} is missing: a task needs its tests")
    environment = _environment(folder, config)
    solution_dir = folder / "solution"
    solution = _read_tree(solution_dir) if solution_dir.is_dir() else None
    if solution is not None and "solve.sh" not in solution:
        raise EnvLoadError(f"{solution_dir / 'solve.sh'} is missing (solution/ has no solve.sh)")
    mapped = _mapping(environment.workdir)
    copies = _copied_files(folder / "environment", environment)
    files = {name: data for copy in copies for name, data in copy.files.items()}
    executables = frozenset().union(*(c.executables for c in copies))
    task_meta = config.get("task") if isinstance(config.get("task"), dict) else {}
    resources = read_resources(folder / "task.toml", config)
    return HarborTask(
        path=folder,
        name=str(task_meta.get("name") or folder.name),
        instruction=rewrite_paths(instruction, mapped),
        files=files,
        executables=executables,
        tests=_rewrite_all(tests, _without(mapped, VERIFIER_PATHS)),
        solution=None if solution is None else _rewrite_all(solution, mapped),
        resources=resources,
        env=_rewrite_values(environment.env, _workdir_only(environment.workdir)),
        metadata=dict(_section(config, "metadata")),
        build=_build(environment, copies, resources.build_timeout),
    )


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


def _rewrite_all(files: dict[str, bytes], mapping: dict[str, str]) -> dict[str, bytes]:
    return {name: rewrite_bytes(data, mapping) for name, data in files.items()}


VERIFIER_PATHS = ("/tests", "/logs/verifier")


def verifier_paths(folder: str) -> dict[str, str]:
    """Harbor's ``/tests`` and ``/logs/verifier`` under ``folder``."""
    return {"/tests": f"{folder}/tests", "/logs/verifier": f"{folder}/logs/verifier"}


def _without(mapping: dict[str, str], keys: tuple[str, ...]) -> dict[str, str]:
    return {k: v for k, v in mapping.items() if k not in keys}


def _mapping(workdir: str) -> dict[str, str]:
    mapping = {"/tests": TESTS_DIR, "/solution": SOLUTION_DIR, "/logs/verifier": VERIFIER_LOGS}
    if workdir not in ("/", ""):
        mapping[workdir] = WORKDIR
    return mapping


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


def _environment(folder: Path, config: dict[str, Any]) -> Environment:
    env_dir = folder / "environment"
    for name in ("docker-compose.yaml", "docker-compose.yml"):
        if (env_dir / name).is_file():
            raise UnsupportedEnvironment(
                f"{env_dir / name}: a task of several containers (docker compose) cannot run "
                "here; envhub runs Harbor tasks on the host's base system in its sandbox"
            )
    image = _section(config, "environment").get("docker_image")
    if (env_dir / "Dockerfile").is_file():
        return read_dockerfile(env_dir / "Dockerfile")
    if image:
        check_image(str(image), f"{folder / 'task.toml'} [environment] docker_image")
        return Environment(image=str(image))
    return Environment(workdir=DEFAULT_WORKDIR)


def _workdir_only(workdir: str) -> dict[str, str]:
    return {} if workdir in ("/", "") else {workdir: WORKDIR}


def _rewrite_values(env: dict[str, str], mapping: dict[str, str]) -> dict[str, str]:
    return {key: rewrite_paths(value, mapping) for key, value in env.items()}


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
        env=_rewrite_values(run.env, mapping),
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
