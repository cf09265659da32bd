"""Harbor task folders as Hub packages: ``envhub push ./tasks`` wraps them, nothing to write.

A Harbor folder (one task, or a folder of tasks) has no ``pyproject.toml``, and should not need
one: it stays a plain Harbor folder that Harbor's own tools read. ``envhub push`` on it builds
the package at push time, in a temporary folder:

- ``pyproject.toml``: the package ``NAME`` (the repo's name, else the folder's) at ``--version``
  (default :data:`DEFAULT_VERSION`), one env ``NAME``, and ``[tool.envhub]`` naming the tasks'
  folder and their executable files;
- ``harbor_<name>/__init__.py``: the env, a :class:`~envhub.harbor.env.HarborEnv` on the tasks
  installed beside it;
- ``harbor_<name>/tasks/<task>/...``: each task folder's files (secrets and junk left out and
  listed, as for any package).

The push gate is the task check (:func:`~envhub.harbor.check.check_tasks`) on that copy, so a
file the push leaves out that a task needs fails the gate; its table goes on the card and its
verdict in ``envhub.json``. From there the package is like any other: versions are tags,
``envhub install owner/name@version`` pins it in ``envhub.lock``, ``envhub.make("owner/name")``
gives the env back, and ``envhub check`` on the package folder or the installed env checks the
tasks' solutions again.

The Hub keeps no file modes, so the package lists its executable files and
:func:`restore_modes` sets them again where the package is loaded.
"""

from __future__ import annotations

import re
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envhub.errors import ConfigError, EnvCheckError, EnvLoadError
from envhub.hub.files import CARD, select_files
from envhub.hub.publish import check_names, publish_package

DEFAULT_VERSION = "0.1.0"
_EXECUTABLE_BITS = stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH


@dataclass
class Wrapped:
    """A Harbor folder made a package, ready to stage."""

    folder: Path
    name: str
    module: str
    version: str
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """(path, reason) of the source files left out."""

    @property
    def tasks(self) -> Path:
        """Where the task folders are inside the package."""
        return self.folder / self.module / "tasks"

    @property
    def envs(self) -> dict[str, str]:
        """The package's one env and its entry point."""
        return {self.name: f"{self.module}:Tasks"}


@dataclass
class TasksReport:
    """The push gate of a Harbor package: each task's solution check, shaped as the package
    report :func:`~envhub.hub.push.push` puts on the card and in the manifest."""

    checks: list[Any]
    performance: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """Every task passed (its solution scores 1, doing nothing below 1)."""
        return bool(self.checks) and all(c.passed for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        """The verdict and each task's rewards, for ``envhub.json``."""
        return {
            "passed": self.passed,
            "harbor_tasks": [
                {"task": c.name, "solved": c.solved, "unsolved": c.unsolved,
                 "passed": c.passed, "error": c.error}
                for c in self.checks
            ],
        }  # fmt: skip

    def to_markdown(self) -> str:
        """The card's table: each task's reward with its solution and with nothing done."""
        verdict = "passed" if self.passed else "FAILED"
        rows = "".join(
            f"| {c.name} | {_reward_text(c.solved)} | {_reward_text(c.unsolved)} "
            f"| {'ok' if c.passed else 'fail'} |\n"
            for c in self.checks
        )
        return (
            f"`envhub check` {verdict}: each task's `solution/solve.sh` must score 1 and doing "
            "nothing below 1.\n\n| task | with solution | without | result |\n"
            f"|---|---|---|---|\n{rows}"
        )

    def failure_lines(self) -> str:
        """One line per failed task, for the refusal."""
        return "\n".join(
            f"  - {c.name}: " + (c.error or f"with its solution {c.solved}, without {c.unsolved}")
            for c in self.checks
            if not c.passed
        )


def is_harbor_folder(root: Path) -> bool:
    """Whether ``root`` is a Harbor task folder (or a folder of them) and no package."""
    from envhub.loader import is_task_path

    return not (root / "pyproject.toml").is_file() and is_task_path(str(root))


def distribution_name(repo_id: str) -> str:
    """The package name for ``owner/name``: its name, lower case, runs of ``-_.`` as ``-``."""
    name = re.sub(r"[-_.]+", "-", repo_id.rsplit("/", 1)[-1]).strip("-").lower()
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name):
        raise ConfigError(f"cannot name a package after {repo_id!r}; pass --repo owner/name")
    return name


def wrap_tasks(root: Path, target: Path, name: str, version: str) -> Wrapped:
    """Write the package of the Harbor folder ``root`` into ``target`` (see the module
    docstring).

    Raises:
        EnvLoadError: ``root`` holds no task folder.
        ConfigError: ``version`` is no valid version.
    """
    from envhub.harbor.task import find_task_folders

    _check_version(version)
    module = "harbor_" + name.replace("-", "_")
    wrapped = Wrapped(target, name, module, version)
    folders = find_task_folders(root)
    single = folders == [root]
    selection = select_files(root)
    wrapped.skipped = list(selection.skipped)
    executables = []
    for relative in selection.files:
        source = root / relative
        inside = f"{root.name}/{relative}" if single else relative
        if not single and not any(source.is_relative_to(f) for f in folders):
            if relative == CARD:
                _copy(source, target / CARD)
            else:
                wrapped.skipped.append((relative, "not inside a task folder"))
            continue
        _copy(source, wrapped.tasks / inside)
        if source.stat().st_mode & stat.S_IXUSR:
            executables.append(inside)
    if not (target / CARD).is_file():
        names = ", ".join(f.name for f in folders)
        (target / CARD).write_text(f"# {name}\n\nHarbor tasks: {names}.\n", encoding="utf-8")
    (target / "pyproject.toml").write_text(_pyproject(wrapped, executables), encoding="utf-8")
    (target / module / "__init__.py").write_text(_module(wrapped, executables), encoding="utf-8")
    return wrapped


def check_wrapped(wrapped: Wrapped) -> TasksReport:
    """The push gate: every task's solution check, on the package's own copy of the tasks."""
    from envhub.harbor.check import check_tasks

    return TasksReport(check_tasks(wrapped.tasks))


def harbor_tasks_of(package: Path) -> Path | None:
    """The tasks folder of a package folder made by :func:`wrap_tasks` (``None`` for other
    packages), with its files' modes restored."""
    from envhub.package import read_pyproject

    try:
        tool = read_pyproject(package).get("tool", {}).get("envhub", {})
    except EnvLoadError:
        return None
    if not isinstance(tool, dict) or not isinstance(tool.get("harbor"), str):
        return None
    tasks = package / tool["harbor"]
    restore_modes(tasks, tool.get("executables", []))
    return tasks


def restore_modes(tasks: Path, executables: list[str]) -> None:
    """Make ``executables`` (paths under ``tasks``) executable again, where they are not yet
    (the Hub keeps no modes); files that cannot be changed are left as they are."""
    for relative in executables:
        path = tasks / relative
        try:
            mode = path.stat().st_mode
            if mode & _EXECUTABLE_BITS != _EXECUTABLE_BITS:
                path.chmod(mode | _EXECUTABLE_BITS)
        except OSError:
            continue


def push_tasks(
    root: Path,
    repo_id: str | None,
    *,
    private: bool,
    version: str | None,
    token: str | None,
    check: bool,
) -> Any:
    """:func:`~envhub.hub.push.push` of a Harbor folder: wrap it, check its tasks, publish.

    Raises:
        EnvCheckError: A task's solution check failed.
        VersionConflictError: The version exists with other content (pass a new ``version``).
    """
    from envhub.hub import client

    name = distribution_name(repo_id or root.name)
    token = client.require_token(token, "envhub push")
    if repo_id is None:
        with client.hub_errors("who am I", "-"):
            repo_id = f"{client.api(token).whoami()['name']}/{name}"
    with tempfile.TemporaryDirectory(prefix="envhub-harbor-") as tmp:
        wrapped = wrap_tasks(root, Path(tmp) / "package", name, version or DEFAULT_VERSION)
        notes = _check_names(wrapped, repo_id) if check else []
        report = check_wrapped(wrapped) if check else None
        if report is not None and not report.passed:
            raise EnvCheckError(
                f"not pushed: {root} has task(s) whose solution check fails:\n"
                f"{report.failure_lines()}"
            )
        result = publish_package(
            wrapped.folder, repo_id, private=private, token=token, report=report,
            envs=wrapped.envs, bump_hint="pass a new --version",
        )  # fmt: skip
    result.skipped = wrapped.skipped + [s for s in result.skipped if s not in wrapped.skipped]
    result.notes = notes
    return result


def _check_names(wrapped: Wrapped, repo_id: str) -> list[str]:
    """:func:`~envhub.hub.publish.check_names` of the wrapped package, whose names come from the
    repo's: a refusal says to push to another repo name."""
    try:
        return check_names(wrapped.folder, repo_id)
    except EnvCheckError as e:
        raise EnvCheckError(
            f"{e} (a Harbor folder's package is named after its repo: push it with "
            "--repo OWNER/ANOTHER-NAME)"
        ) from None


def _check_version(version: str) -> None:
    from packaging.version import InvalidVersion, Version

    try:
        Version(version)
    except InvalidVersion:
        raise ConfigError(f"--version {version!r} is not a version such as 0.1.0") from None


def _copy(source: Path, destination: Path) -> None:
    destination.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, destination)


def _pyproject(wrapped: Wrapped, executables: list[str]) -> str:
    from envhub.version import __version__

    module, name = wrapped.module, wrapped.name
    listed = "".join(f"  {path!r},\n".replace("'", '"') for path in sorted(executables))
    return f"""[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "{wrapped.version}"
description = "Harbor tasks, packaged by envhub push."
readme = "README.md"
requires-python = ">=3.10"
dependencies = ["envhub>={__version__}"]

[project.entry-points."envhub.envs"]
{name} = "{module}:Tasks"

[tool.setuptools]
packages = ["{module}"]

[tool.setuptools.package-data]
{module} = ["tasks/**/*", "tasks/**/.*"]

[tool.envhub]
harbor = "{module}/tasks"
executables = [
{listed}]
"""


def _module(wrapped: Wrapped, executables: list[str]) -> str:
    return f'''"""The Harbor tasks of {wrapped.name} {wrapped.version} (packaged by envhub push)."""

from pathlib import Path

from envhub.harbor.env import HarborEnv
from envhub.hub.harbor_package import restore_modes

TASKS = Path(__file__).parent / "tasks"
EXECUTABLES = {sorted(executables)!r}


class Tasks(HarborEnv):
    """The package's Harbor tasks as one env."""

    name = {wrapped.name!r}
    version = {wrapped.version!r}

    def __init__(self, **kwargs):
        restore_modes(TASKS, EXECUTABLES)
        super().__init__(TASKS, **kwargs)
'''


def _reward_text(reward: float | None) -> str:
    """A check's reward for the card (``-``: that run did not happen or failed)."""
    return "-" if reward is None else f"{reward:g}"
