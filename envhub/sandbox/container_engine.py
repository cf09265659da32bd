"""A container engine's command line (Podman, or Docker's compatible CLI): what the container
back end asks of it, each a short call, and nothing it keeps.

The flags every container gets (:meth:`ContainerEngine.run_flags`) are the ones these
machines need and any other machine accepts: explicit ``--ulimit`` values under the host's hard
limits (the engine's defaults can exceed them, and runc then fails with "setrlimit ...
Operation not permitted"), no new privileges. ``ENVHUB_CONTAINER_ENGINE_ARGS`` adds global
flags (``--runtime runc --cgroup-manager=cgroupfs`` where the engine's defaults do not run).

Images are built from a Dockerfile and cached by content (:meth:`ContainerEngine.build`): the
tag is a hash of the Dockerfile as built and every file of the context, so the same task builds
once. Every container envhub starts carries :data:`OWNER_LABEL` (the ``PID:START`` of the run
that started it), which is how a killed run's containers are found and removed.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from envhub.errors import SandboxError, SandboxUnavailableError

ENGINES = ("podman", "docker")
"""The engines envhub drives, in the order it looks for them."""
ARGS_ENV = "ENVHUB_CONTAINER_ENGINE_ARGS"
"""Global flags for the engine (shell words), before each subcommand."""
OWNER_LABEL = "envhub.owner"
"""Label on every container envhub starts: ``PID:START`` of the run that owns it."""
BUILD_PREFIX = "localhost/envhub-build"
"""Repository of the images :meth:`ContainerEngine.build` makes (tag: the content hash)."""
NPROC = 4096
"""The containers' ``--ulimit nproc`` (the engine's own processes count against it, and root
ignores it: the pids limit is what bounds a session's processes)."""


def engine_problem(name: str | None = None) -> str | None:
    """Why no container engine (or not ``name``) can run here, or ``None`` when one can."""
    names = [name] if name else list(ENGINES)
    for each in names:
        if shutil.which(each) is None:
            continue
        probe = subprocess.run(
            [each, *global_args(), "info", "--format", "json"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        if probe.returncode == 0:
            return None
        return f"{each} is installed but `{each} info` failed: {probe.stderr.strip()[-300:]}"
    wanted = name or " or ".join(ENGINES)
    return (
        f"no container engine: {wanted} is not installed. Install Podman (`apt-get install "
        "podman`) or Docker, or use the local (bubblewrap) sandbox"
    )


def global_args() -> list[str]:
    """The flags of :data:`ARGS_ENV`, split as a shell would."""
    return shlex.split(os.environ.get(ARGS_ENV, ""))


@dataclass
class ContainerEngine:
    """One engine's CLI (``podman`` or ``docker``), found on ``PATH``.

    Raises:
        SandboxUnavailableError: No such engine (or none at all) can run here.
    """

    name: str | None = None
    """``podman``, ``docker``, or ``None``: the first of :data:`ENGINES` that runs."""
    argv: list[str] = field(init=False)
    """The engine's command and global flags."""

    def __post_init__(self) -> None:
        problem = engine_problem(self.name)
        if problem is not None:
            raise SandboxUnavailableError(problem)
        self.name = self.name or next(e for e in ENGINES if engine_problem(e) is None)
        self.argv = [self.name, *global_args()]

    def command(self, *args: str) -> list[str]:
        """The argv of an engine subcommand."""
        return [*self.argv, *args]

    def call(self, *args: str, timeout: float = 120.0, stdin: bytes | None = None) -> str:
        """Run a subcommand; its stdout.

        Raises:
            SandboxError: It failed (the message has its stderr's end).
        """
        try:
            done = subprocess.run(
                self.command(*args), input=stdin, capture_output=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            raise SandboxError(f"`{self.name} {args[0]}` took over {timeout:g} s") from None
        if done.returncode != 0:
            err = done.stderr.decode("utf-8", "replace").strip()[-500:]
            raise SandboxError(f"`{self.name} {shlex.join(args[:3])} ...` failed: {err}")
        return done.stdout.decode("utf-8", "replace")

    def image_exists(self, image: str) -> bool:
        """Whether ``image`` is in the engine's local store."""
        return (
            subprocess.run(
                self.command("image", "inspect", image), capture_output=True, timeout=60
            ).returncode
            == 0
        )

    def run_flags(self, open_files: int) -> list[str]:
        """Flags every container gets (see the module docstring)."""
        files = _under_hard(resource.RLIMIT_NOFILE, open_files)
        procs = _under_hard(resource.RLIMIT_NPROC, NPROC)
        return [
            "--security-opt=no-new-privileges",
            f"--ulimit=nofile={files}:{files}",
            f"--ulimit=nproc={procs}:{procs}",
        ]

    def build(
        self, context: Path, dockerfile: str, *, network: bool = True, timeout: float = 1800.0
    ) -> str:
        """The image of ``dockerfile`` (its text) built in ``context``: built once, then found
        by its content tag. ``network``: whether ``RUN`` steps may reach the network.

        Raises:
            SandboxError: The build failed (the message ends with the build's output).
        """
        tag = f"{BUILD_PREFIX}:{content_hash(context, dockerfile)}"
        if self.image_exists(tag):
            return tag
        with tempfile.NamedTemporaryFile("w", suffix=".Dockerfile", delete=False) as written:
            written.write(dockerfile)
        limits = self.run_flags(1024)[1:]  # the ulimits: RUN steps need them as containers do
        try:
            self.call(
                "build", "--quiet", "-f", written.name, "-t", tag,
                f"--network={'host' if network else 'none'}", *limits, str(context),
                timeout=timeout,
            )  # fmt: skip
        finally:
            os.unlink(written.name)
        return tag

    def owned_containers(self) -> dict[str, str]:
        """Every container with :data:`OWNER_LABEL`: id -> its owner's ``PID:START``."""
        # Podman's ps exposes labels as a map, Docker's as a string with a Label method.
        owner = (
            f'{{{{.Label "{OWNER_LABEL}"}}}}' if self.name == "docker"
            else f'{{{{index .Labels "{OWNER_LABEL}"}}}}'
        )  # fmt: skip
        listed = self.call(
            "ps", "-a", "--no-trunc", "--filter", f"label={OWNER_LABEL}",
            "--format", "{{.ID}} " + owner,
        )  # fmt: skip
        pairs = (line.split(" ", 1) for line in listed.splitlines() if " " in line)
        return {ident: tag for ident, tag in pairs if ident and tag}

    def remove(self, containers: Sequence[str]) -> None:
        """Remove ``containers`` at once, running or not (gone ones are no error)."""
        if containers:
            subprocess.run(
                self.command("rm", "-f", "-t", "0", *containers), capture_output=True, timeout=120
            )


def _under_hard(which: int, wanted: int) -> int:
    """``wanted``, lowered to this process's hard limit of ``which`` (the container's cannot
    exceed the engine's, which is ours)."""
    hard = resource.getrlimit(which)[1]
    return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)


def content_hash(context: Path, dockerfile: str) -> str:
    """A hash of ``dockerfile`` and every file under ``context`` (paths, modes, bytes)."""
    digest = hashlib.sha256(dockerfile.encode())
    for path in sorted(p for p in context.rglob("*") if p.is_file() or p.is_symlink()):
        relative = path.relative_to(context).as_posix()
        data = os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
        digest.update(f"\0{relative}\0{path.lstat().st_mode:o}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()[:24]


def env_flags(env: Mapping[str, str]) -> list[str]:
    """``--env K=V`` for each variable."""
    return [f"--env={key}={value}" for key, value in env.items() if key]


def inspect(engine: ContainerEngine, container: str) -> dict:
    """The engine's ``inspect`` of one container."""
    return json.loads(engine.call("inspect", container))[0]
