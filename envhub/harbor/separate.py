"""Tests in a container of their own: Harbor's ``[verifier] environment_mode = "separate"``.

A task may ask for its tests to run apart from the agent's container (``environment_mode =
"separate"``, or a ``[verifier.environment]`` table, which implies it). Harbor then, once the
agent has stopped:

1. copies the task's **artifacts** out of the agent's container: ``/logs/artifacts`` always,
   and each path of ``task.toml``'s top-level ``artifacts = [...]`` (a path, or a table with
   ``source`` and ``exclude`` patterns); a missing one is skipped;
2. stops the agent's container (here: ends every process in it);
3. starts the **verifier's container**: ``[verifier.environment] docker_image`` if given, else
   an image built from ``tests/Dockerfile`` (its context ``tests/``); either one holds the
   tests itself (``/tests/test.sh``), so nothing is copied in. Without either, a fresh
   container of the task's own image, with ``tests/`` copied to ``/tests`` as in the shared
   mode;
4. puts each artifact back at its own path there (``/app/answer.txt`` stays
   ``/app/answer.txt``), empties ``/logs/verifier`` and runs ``/tests/test.sh``; the reward is
   read as in the shared mode.

Artifacts cross on the host as one tar, re-packed there (:func:`sanitized`: no link out of
its artifact, no device, no setuid bit), as Harbor sanitizes them. This module
reads the task's settings (:func:`read_separate`) and moves the artifacts
(:func:`collect_artifacts`, :func:`place_artifacts`); :class:`~envhub.harbor.env.HarborEnv`
runs the rest. Only a container back end runs such a task; bubblewrap refuses it at load.
The agent's image needs ``tar`` (Debian's, Ubuntu's and the official Python images have it).
"""

from __future__ import annotations

import io
import posixpath
import shlex
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envhub.errors import EnvLoadError, VerifierError
from envhub.harbor.dockerfile import CONTAINER_HINT, UnsupportedEnvironment, container_environment

if TYPE_CHECKING:
    from envhub.sandbox.session import Session

ARTIFACTS_DIR = "/logs/artifacts"
"""Harbor's conventional artifacts folder: always copied across."""
MODES = ("shared", "separate")
# The artifacts' tar holds paths relative to /: unpacked there, each is at its own path.
_UNPACK = "exec tar -C / -xf - --no-same-owner"


@dataclass(frozen=True)
class Artifact:
    """A path copied from the agent's container to the verifier's."""

    source: str
    """Its path in the agent's container, and where it goes in the verifier's (a relative one
    is under the task's working folder)."""
    exclude: tuple[str, ...] = ()
    """``tar --exclude`` patterns, for a folder."""


@dataclass(frozen=True)
class SeparateVerifier:
    """Where a task's tests run when they run apart (see the module docstring)."""

    image: str | None = None
    """``[verifier.environment] docker_image``."""
    dockerfile: Path | None = None
    """``tests/Dockerfile`` (built with ``tests/`` as its context), when no image is named."""
    workdir: str = "/"
    """The folder ``test.sh`` starts in: the verifier image's ``WORKDIR``."""
    artifacts: tuple[Artifact, ...] = (Artifact(ARTIFACTS_DIR),)

    @property
    def bundled(self) -> bool:
        """Whether the verifier's image holds the tests (else ``tests/`` is copied in)."""
        return self.image is not None or self.dockerfile is not None


def read_separate(
    folder: Path, config: dict[str, Any], in_container: bool
) -> SeparateVerifier | None:
    """The task's separate verifier, or ``None`` when its tests share the agent's container.

    Raises:
        EnvLoadError: A malformed ``[verifier]`` or ``artifacts`` (the field named).
        UnsupportedEnvironment: Not ``in_container`` (bubblewrap), or tests of several
            containers (``tests/docker-compose.yaml``), or artifacts of another service.
    """
    file = folder / "task.toml"
    verifier = _table(config, "verifier", file)
    environment = verifier.get("environment")
    mode = verifier.get("environment_mode")
    if mode is not None and mode not in MODES:
        raise EnvLoadError(
            f"{file}: [verifier] environment_mode must be one of {MODES}, not {mode!r}"
        )
    if environment is not None and not isinstance(environment, dict):
        raise EnvLoadError(f"{file}: [verifier.environment] must be a table")
    if mode == "shared" and environment is not None:
        raise EnvLoadError(
            f'{file}: [verifier] environment_mode = "shared" contradicts [verifier.environment]; '
            'drop the table or set environment_mode = "separate"'
        )
    if mode != "separate" and environment is None:
        return None
    if not in_container:
        raise UnsupportedEnvironment(
            f'{file}: [verifier] environment_mode = "separate": its tests run in a container of '
            f"their own, which the bubblewrap sandbox cannot start; {CONTAINER_HINT}"
        )
    return _separate(folder, environment or {}, _artifacts(config, file))


def _separate(
    folder: Path, environment: dict[str, Any], artifacts: tuple[Artifact, ...]
) -> SeparateVerifier:
    tests = folder / "tests"
    if (tests / "docker-compose.yaml").is_file() or (tests / "docker-compose.yml").is_file():
        raise UnsupportedEnvironment(
            f"{tests / 'docker-compose.yaml'}: a verifier of several containers (docker compose) "
            "cannot run here; envhub runs a task's tests in one container"
        )
    image = environment.get("docker_image")
    if image is not None:
        return SeparateVerifier(image=str(image), artifacts=artifacts)
    dockerfile = tests / "Dockerfile"
    if dockerfile.is_file():
        built = container_environment(dockerfile, None)
        workdir = built.workdir if built.explicit_workdir else "/"
        return SeparateVerifier(dockerfile=dockerfile, workdir=workdir, artifacts=artifacts)
    return SeparateVerifier(artifacts=artifacts)


def _artifacts(config: dict[str, Any], file: Path) -> tuple[Artifact, ...]:
    """``/logs/artifacts`` and the top-level ``artifacts`` entries, in order."""
    entries = config.get("artifacts", [])
    if not isinstance(entries, list):
        raise EnvLoadError(f"{file}: artifacts must be a list of paths or tables, got {entries!r}")
    found = [Artifact(ARTIFACTS_DIR)]
    for entry in entries:
        entry = {"source": entry} if isinstance(entry, str) else entry
        source = entry.get("source") if isinstance(entry, dict) else None
        if not isinstance(source, str) or not source or ".." in source.split("/"):
            raise EnvLoadError(
                f"{file}: each artifacts entry is a path or a table with a source path "
                f"(no '..'), got {entry!r}"
            )
        if entry.get("service") not in (None, "main"):
            raise UnsupportedEnvironment(
                f"{file}: artifacts from service {entry['service']!r}: a task of several "
                "containers cannot run here"
            )
        exclude = entry.get("exclude", [])
        if not isinstance(exclude, list) or not all(isinstance(e, str) for e in exclude):
            raise EnvLoadError(f"{file}: artifacts exclude must be a list of patterns")
        if source not in (a.source for a in found):
            found.append(Artifact(source, tuple(exclude)))
    return tuple(found)


def _table(config: dict[str, Any], name: str, file: Path) -> dict[str, Any]:
    value = config.get(name, {})
    if not isinstance(value, dict):
        raise EnvLoadError(f"{file}: [{name}] must be a table")
    return value


async def collect_artifacts(
    session: Session, separate: SeparateVerifier, workdir: str, cap: int
) -> bytes:
    """One sanitized tar of the artifacts present in ``session`` (see :func:`sanitized`),
    from one call (``workdir``: the task's working folder, which relative ones are under;
    ``cap``: the most bytes of them all; empty when none is there).

    Raises:
        VerifierError: An artifact could not be packed, or they are larger than ``cap``.
    """
    roots = [_root(workdir, artifact.source) for artifact in separate.artifacts]
    steps = []
    for root, artifact in zip(roots, separate.artifacts, strict=True):
        flags = " ".join(shlex.quote(f"--exclude={p}") for p in artifact.exclude)
        path = shlex.quote(root)
        steps.append(
            f"if [ -e {path} ] || [ -L {path} ]; then tar -cf - {flags} -- {path} || exit 1; fi"
        )
    packed = await session._run_helper(["/bin/sh", "-c", "cd / && " + "; ".join(steps)], None, cap)
    if packed.stop_reason == "output_limit":
        raise VerifierError(f"the artifacts are larger than {cap} bytes")
    if not packed.ok:
        raise VerifierError(
            f"could not copy the artifacts out of the agent's container ({packed.describe()}): "
            f"{packed.stderr.strip()[-300:]}"
        )
    data = packed.stdout.encode("utf-8", "surrogateescape")
    return sanitized(data, roots) if data else b""


async def place_artifacts(session: Session, data: bytes) -> None:
    """Unpack the artifacts (:func:`collect_artifacts`) at their own paths in the verifier's
    ``session``.

    Raises:
        VerifierError: They could not be unpacked there.
    """
    if not data:
        return
    result = await session.arun(["/bin/sh", "-c", _UNPACK], stdin=data)
    if not result.ok:
        raise VerifierError(
            f"could not put the artifacts in the verifier's container "
            f"({result.describe()}): {result.stderr.strip()[-300:]}"
        )


def _root(workdir: str, source: str) -> str:
    """An artifact's path, relative to ``/``."""
    return posixpath.normpath(posixpath.join(workdir, source)).lstrip("/")


def sanitized(data: bytes, roots: list[str]) -> bytes:
    """``data`` (tars one after another, paths relative to ``/``) as one tar of what may cross:
    regular files, folders, and links that stay inside their artifact (``roots``: the
    artifacts' paths; a link from an answer to the tests' own expected output would otherwise
    grade it against itself), without setuid bits or owners."""
    kept = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(data), ignore_zeros=True) as source,
        tarfile.open(fileobj=kept, mode="w", format=tarfile.PAX_FORMAT) as out,
    ):
        for member in source:
            allowed = _allowed(member, roots)
            if allowed is None:
                continue
            body = source.extractfile(member) if allowed.isfile() else None
            out.addfile(allowed, body)
    return kept.getvalue()


def _allowed(member: tarfile.TarInfo, roots: list[str]) -> tarfile.TarInfo | None:
    """``member`` made safe to unpack (``None``: it may not cross)."""
    name = posixpath.normpath(member.name)
    inside = [r for r in roots if _within(name, r)]
    if not inside or not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        return None
    root = max(inside, key=len)
    if member.issym() or member.islnk():
        base = "" if member.islnk() else posixpath.dirname(name)
        target = posixpath.normpath(posixpath.join(base, member.linkname))
        if member.linkname.startswith("/") or not _within(target, root):
            return None
    try:
        member = tarfile.data_filter(member, "/nonexistent-root")
    except tarfile.FilterError:
        return None
    mode = 0o777 if member.mode is None else member.mode  # a link's: None
    return member.replace(mode=mode, uid=0, gid=0, uname="", gname="", deep=False)


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root + "/")
