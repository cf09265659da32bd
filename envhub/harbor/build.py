"""Preparing a Harbor task's workspace from its Dockerfile's ``RUN`` steps, once per task.

A task whose Dockerfile has ``RUN`` steps (:mod:`envhub.harbor.dockerfile`) gets a
:class:`Build`: its copies and steps in order. :func:`prepare` runs it in a local sandbox
session (no network, the host's system read-only, only ``/sandbox`` and ``/tmp`` writable, the
task's memory and storage limits, each step limited to the task's ``build_timeout_sec``,
default 600 s): each copy unpacked into ``/sandbox``, each step run in its folder with its
variables, ``apt-get``, ``apt``, ``pip``, ``pip3`` and ``python3 -m pip`` standing in as
:mod:`envhub.harbor.installs` (satisfied installs pass, others fail saying what to do). The
resulting ``/sandbox`` is packed, unpacked on the host (its files owned by this user, links
kept, nothing outside the folder) and kept as the task's :class:`~envhub.sandbox.Workspace`:
every episode starts from it copy-on-write, as from a task's plain files.

**Cache.** The prepared folder lives under ``<cache>/harbor-workspaces/<key>``
(:func:`envhub.paths.cache_dir`), ``key`` a hash of the build: the Dockerfile's steps as
mapped here and every copied file's bytes and mode. So a task is prepared once per content,
shared by every env, process and command (``check``, ``eval``, ``train``) on the machine; a
changed Dockerfile or file gives a new key. Concurrent preparations of one task in one event
loop share one run; across processes the first to finish wins (each builds aside and renames
into place). A step that fails raises
:class:`~envhub.harbor.dockerfile.UnsupportedEnvironment` with its line, the step and the end
of its output; nothing is cached then.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import io
import posixpath
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from envhub.harbor.build_check import SYSTEM_PATH
from envhub.harbor.dockerfile import UnsupportedEnvironment
from envhub.harbor.installs import ADVICE, host_packages
from envhub.paths import cache_dir
from envhub.sandbox.base import WORKDIR, ExecResult, Limits
from envhub.sandbox.jail import ENV as SANDBOX_ENV
from envhub.sandbox.session import Session, Workspace

if TYPE_CHECKING:
    from envhub.sandbox.base import Sandbox

FORMAT = "1"
"""Part of every build's key: a change to how builds run here prepares every task again."""
BUILD_DIR = "/tmp/.envhub-build"
"""Where the stand-ins for the package tools live in a preparation session."""
DEFAULT_BUILD_TIMEOUT = 600.0
PREPARED: dict[str, Workspace] = {}
"""Prepared workspaces of this process, by build key."""
_PENDING: dict[tuple[int, str], asyncio.Task[Workspace]] = {}
_IN_FOLDER = 'mkdir -p -- "$1" && cd -- "$1" || exit 1; shift; exec "$@"'
_INSTALLS = Path(__file__).with_name("installs.py")


@dataclass(frozen=True)
class CopyStep:
    """Files a ``COPY``/``ADD`` puts in the working folder (relative paths)."""

    files: dict[str, bytes]
    executables: frozenset[str]


@dataclass(frozen=True)
class RunStep:
    """A ``RUN`` step as it runs here: paths mapped into the sandbox."""

    where: str
    """``Dockerfile:line``."""
    text: str
    """The step as the Dockerfile wrote it (for messages)."""
    argv: tuple[str, ...]
    cwd: str
    """The folder it runs in, under ``/sandbox``."""
    env: dict[str, str]


@dataclass(frozen=True)
class Build:
    """A task's copies and ``RUN`` steps in order, and how long each step may run."""

    steps: tuple[CopyStep | RunStep, ...]
    timeout: float = DEFAULT_BUILD_TIMEOUT

    @functools.cached_property
    def key(self) -> str:
        """A hash of everything the prepared folder depends on (see the module docstring)."""
        return _key(self.steps)


def _key(steps: tuple[CopyStep | RunStep, ...]) -> str:
    digest = hashlib.sha256(FORMAT.encode())
    for step in steps:
        if isinstance(step, CopyStep):
            for name in sorted(step.files):
                digest.update(repr((name, name in step.executables)).encode())
                digest.update(hashlib.sha256(step.files[name]).digest())
        else:
            digest.update(repr((step.argv, step.cwd, sorted(step.env.items()))).encode())
    return digest.hexdigest()[:32]


def prepared_root() -> Path:
    """Where prepared workspaces are kept: ``<cache>/harbor-workspaces``."""
    return cache_dir() / "harbor-workspaces"


def prepared(build: Build) -> Workspace | None:
    """The build's prepared workspace, if this process or an earlier one made it."""
    key = build.key
    if key not in PREPARED and (prepared_root() / key).is_dir():
        PREPARED[key] = Workspace(prepared_root() / key)
    return PREPARED.get(key)


async def prepare(
    build: Build, sandbox: Sandbox | None, limits: Limits, env: dict[str, str]
) -> Workspace:
    """The build's workspace: from the cache, else made now (see the module docstring).

    Args:
        build: The task's build.
        sandbox: The env's sandbox (a local one runs the steps; otherwise the default one).
        limits: The task's session limits (memory, storage).
        env: Variables every step runs with (under the Dockerfile's own).

    Raises:
        UnsupportedEnvironment: A step failed (its line, the step, the end of its output).
    """
    done = prepared(build)
    if done is not None:
        return done
    loop = asyncio.get_running_loop()
    slot = (id(loop), build.key)
    pending = _PENDING.get(slot)
    if pending is None:
        pending = loop.create_task(_prepare_now(build, sandbox, limits, env))
        _PENDING[slot] = pending
        pending.add_done_callback(lambda _: _PENDING.pop(slot, None))
    return await asyncio.shield(pending)


async def _prepare_now(
    build: Build, sandbox: Sandbox | None, limits: Limits, env: dict[str, str]
) -> Workspace:
    data = await run_steps(build, _local(sandbox), limits, env)
    folder = await asyncio.to_thread(_store, data, build.key)
    PREPARED[build.key] = Workspace(folder)
    return PREPARED[build.key]


def _local(sandbox: Sandbox | None) -> Sandbox:
    from envhub.sandbox.local import LocalSandbox
    from envhub.workspace_env import default_sandbox

    return sandbox if isinstance(sandbox, LocalSandbox) else default_sandbox()


async def run_steps(build: Build, sandbox: Sandbox, limits: Limits, env: dict[str, str]) -> bytes:
    """Run the build in a fresh session of ``sandbox``; the resulting ``/sandbox`` as a tar.

    Raises:
        UnsupportedEnvironment: A step failed.
    """
    limits = limits.with_(wall_time=build.timeout)
    async with sandbox.session(None, limits=limits) as session:  # type: ignore[attr-defined]
        await _unpack(session, BUILD_DIR, stand_ins())
        for step in build.steps:
            if isinstance(step, CopyStep):
                await _unpack(session, WORKDIR, _tar(step.files, step.executables))
            else:
                await _run(session, step, env)
        await session.akill_processes()
        cap = max(limits.disk_mb, 1) << 21
        packed = await session._run_helper(["tar", "-C", WORKDIR, "-cf", "-", "."], None, cap)
        if not packed.ok:
            raise UnsupportedEnvironment(
                f"could not pack the prepared workspace ({packed.describe()}): "
                f"{packed.stderr.strip()[-300:]}"
            )
        return packed.stdout.encode("utf-8", "surrogateescape")


async def _run(session: Session, step: RunStep, env: dict[str, str]) -> None:
    path = step.env.get("PATH", SANDBOX_ENV["PATH"])
    variables = {**env, **step.env, "PATH": f"{BUILD_DIR}/bin:{path}"}
    argv = ["/bin/sh", "-c", _IN_FOLDER, "sh", step.cwd, *step.argv]
    result = await session.arun(argv, env=variables)
    if not result.ok:
        raise UnsupportedEnvironment(step_failure(step, result))


def step_failure(step: RunStep, result: ExecResult) -> str:
    """What a failed step's error says: its line, the step, the end of its output, advice."""
    tail = (result.stdout + result.stderr).strip()[-1500:] or "(nothing)"
    text = " ".join(step.text.split())
    return (
        f"{step.where}: RUN {text[:200]}: failed while preparing the workspace "
        f"({result.describe()}); its output ended with:\n{tail}\n{ADVICE}"
    )


async def _unpack(session: Session, folder: str, data: bytes) -> None:
    script = 'mkdir -p -- "$1" && exec tar -x -m -C "$1" -f -'
    result = await session.arun(["/bin/sh", "-c", script, "sh", folder], stdin=data)
    if not result.ok:
        raise UnsupportedEnvironment(
            f"could not put files in {folder} to prepare the workspace ({result.describe()}): "
            f"{result.stderr.strip()[-300:]}"
        )


def stand_ins() -> bytes:
    """A tar of :data:`BUILD_DIR`: the installs script, the host's package list, and
    ``bin/`` scripts standing in for the package tools."""
    python = shutil.which("python3", path=SYSTEM_PATH) or "/usr/bin/python3"
    run = f"exec {python} -s {BUILD_DIR}/installs.py"
    pip = f'if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then shift 2; {run} pip "$@"; fi\n'
    files = {
        "installs.py": _INSTALLS.read_bytes(),
        "dpkg.txt": "".join(f"{n}\t{v}\tii\n" for n, v in host_packages().items()).encode(),
        "bin/python3": f'#!/bin/sh\n{pip}exec {python} "$@"\n'.encode(),
        "bin/python": (
            f"#!/bin/sh\n{pip}"
            'if [ -x /usr/bin/python ]; then exec /usr/bin/python "$@"; fi\n'
            'echo "envhub: this machine has no python, only python3" >&2; exit 127\n'
        ).encode(),
    }
    for tool in ("apt-get", "apt", "pip", "pip3"):
        name = "pip" if tool.startswith("pip") else tool
        files[f"bin/{tool}"] = f'#!/bin/sh\n{run} {name} "$@"\n'.encode()
    return _tar(files, frozenset(n for n in files if n.startswith("bin/")))


def _tar(files: dict[str, bytes], executables: frozenset[str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755 if name in executables else 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _store(data: bytes, key: str) -> Path:
    """Unpack a prepared ``/sandbox`` into the cache (aside, then renamed into place)."""
    root = prepared_root()
    root.mkdir(parents=True, exist_ok=True)
    final = root / key
    staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            archive.extractall(staging, filter=_as_ours)
        staging.chmod(0o755)
        staging.rename(final)
    except tarfile.TarError as e:
        raise UnsupportedEnvironment(f"the prepared workspace cannot be kept: {e}") from None
    except OSError:
        if not final.is_dir():  # else another process stored it first
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def _as_ours(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo:
    """tarfile's ``tar`` filter (nothing outside the folder, no setuid bits), the files owned
    by this user (a session sees them as its own), and no symbolic link out of the folder but
    into the system's read-only folders (what reads the workspace on the host, such as an
    upload to a remote sandbox, follows links).

    Raises:
        UnsupportedEnvironment: A link elsewhere.
    """
    if member.issym() and not _link_stays_in(member.name, member.linkname):
        raise UnsupportedEnvironment(
            f"a RUN step left a link {member.name.removeprefix('./')} -> {member.linkname} in "
            f"the working folder; links must stay in it or point into {', '.join(SYSTEM_LINKS)}"
        )
    kept = tarfile.tar_filter(member, path)
    return kept.replace(uid=None, gid=None, uname=None, gname=None, deep=False)


SYSTEM_LINKS = ("/usr/", "/bin/", "/sbin/", "/lib/", "/lib64/", "/sandbox/")
"""Where a prepared workspace's absolute links may point: the system's read-only folders
(the same in every session) and the working folder itself."""


def _link_stays_in(name: str, target: str) -> bool:
    if target.startswith("/"):
        return target.startswith(SYSTEM_LINKS) and ".." not in target.split("/")
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
    return resolved != ".." and not resolved.startswith("../")
