"""The container back end: each session (and each one-off run) in a container of an image,
through Podman or Docker (:mod:`envhub.sandbox.container_engine`).

    from envhub.sandbox.container import ContainerSandbox

    sandbox = ContainerSandbox(image="localhost/envhub-base:bookworm")
    async with sandbox.session() as session:
        await session.arun("apt list --installed 2>/dev/null | wc -l")

An image comes from a Dockerfile with :meth:`ContainerSandbox.build` (built once, cached by
content), and :meth:`ContainerSandbox.with_image` gives the same back end on another image (a
task's own). What a session is and how it differs from a local one: see
:mod:`envhub.sandbox.container_session`.

**Nothing outlives its process.** Every container carries the ``PID:START`` of the process
that started it (:data:`~envhub.sandbox.container_engine.OWNER_LABEL`). The first session of a
process starts a reaper (:mod:`envhub.sandbox.container_reaper`) that removes this process's
containers once it dies, however it dies; before that it removes the containers of owners
that are gone (a run killed together with its reaper), each named in the log.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from envhub.errors import SandboxUnavailableError
from envhub.lifetime import start_follower
from envhub.lifetime.procs import alive, owner_tag
from envhub.sandbox.base import Command, ExecResult, Files, Limits, Sandbox
from envhub.sandbox.container_engine import ContainerEngine
from envhub.sandbox.container_session import ContainerSession

if TYPE_CHECKING:
    from envhub.sandbox.session import SessionPaths, Workspace

log = logging.getLogger(__name__)

DEFAULT_IMAGE = "localhost/envhub-base:bookworm"
"""The image of a session when none is named: Debian 12 with Python 3
(``scripts/container_base.sh`` makes it)."""
INITS = ("/usr/libexec/podman/catatonit", "/usr/bin/catatonit")
"""Where a static ``catatonit`` may be: the session's PID 1 in pause mode (no child that a
``kill -9 -1`` could take down with the container)."""
INIT_PATH = "/.envhub-init"
"""Where the init is mounted in a session's container."""
REAPER = Path(__file__).with_name("container_reaper.py")

_claimed: dict[tuple[str, ...], subprocess.Popen[bytes]] = {}
_claim_lock = threading.Lock()


class ContainerSandbox(Sandbox):
    """Runs commands and sessions in containers (see the module docstring).

    Args:
        limits: Default limits of every run and session.
        image: The image sessions start from.
        engine: ``podman``, ``docker``, or ``None`` for the first that runs here.
        python: The Python interpreter in the image (:meth:`arun_python`).
        volumes: Host folders mounted read-only in every session: host path -> path in the
            container (a Harbor task's verifier toolchain: :mod:`envhub.harbor.toolchain`).

    Raises:
        SandboxUnavailableError: No container engine runs here, or the image is missing.
    """

    backend = "container"

    def __init__(
        self,
        limits: Limits | None = None,
        *,
        image: str = DEFAULT_IMAGE,
        engine: str | ContainerEngine | None = None,
        python: str = "python3",
        volumes: dict[str, str] | None = None,
    ) -> None:
        super().__init__(limits, python=python)
        self.volumes = dict(volumes or {})
        self._views: dict[tuple[str, tuple[tuple[str, str], ...]], ContainerSandbox] = {}
        self.engine = engine if isinstance(engine, ContainerEngine) else ContainerEngine(engine)
        self.image = image
        self.owner = owner_tag(os.getpid())
        if not self.engine.image_exists(image):
            raise SandboxUnavailableError(
                f"{self.engine.name} has no image {image!r}: build it (for the default, "
                "`bash scripts/container_base.sh`) or name another with image="
            )

    def with_image(self, image: str, *, volumes: dict[str, str] | None = None) -> ContainerSandbox:
        """The same back end (engine, limits, volumes unless ``volumes``) on ``image`` (made
        once per image and volumes, then the same object)."""
        chosen = self.volumes if volumes is None else dict(volumes)
        key = (image, tuple(sorted(chosen.items())))
        # One view per image: making one asks the engine whether the image exists, and a task's
        # env asks for its image at every episode's start.
        if key not in self._views:
            self._views[key] = ContainerSandbox(
                self.limits, image=image, engine=self.engine, python=self.python, volumes=chosen
            )
        return self._views[key]

    def build(self, context: Path, dockerfile: str, *, network: bool = True) -> str:
        """The tag of ``dockerfile`` built in ``context`` (built once; see
        :meth:`ContainerEngine.build`)."""
        return self.engine.build(context, dockerfile, network=network)

    def session(
        self,
        workspace: Workspace | str | os.PathLike[str] | None = None,
        *,
        limits: Limits | None = None,
        paths: SessionPaths | None = None,
    ) -> ContainerSession:
        """A container that lives for an episode (see :class:`ContainerSession`)."""
        from envhub.sandbox.session import as_workspace

        return ContainerSession(self, as_workspace(workspace), limits or self.limits, paths)

    def session_path_problem(self, path: str) -> str | None:
        """None: a container shows any folder."""
        return None

    async def arun(
        self,
        command: Command,
        *,
        stdin: str | bytes | None = None,
        files: Files | None = None,
        output_files: Sequence[str] = (),
        limits: Limits | None = None,
    ) -> ExecResult:
        """Run ``command`` in a container of its own (a session of one call)."""
        async with self.session(limits=limits) as session:
            for path, data in (files or {}).items():
                await session.write_file(path, data)
            result = await session.arun(command, stdin=stdin)
            outputs = {}
            for path in output_files:
                try:
                    outputs[path] = await session.read_file(path)
                except (FileNotFoundError, IsADirectoryError):
                    continue
        return ExecResult(
            result.stdout, result.stderr, result.exit_code, result.stop_reason,
            result.wall_time, files=outputs,
        )  # fmt: skip

    def init_args(self) -> list[str]:
        """``run`` flags for the session's PID 1 (see :data:`INITS`): catatonit mounted, or
        the engine's own ``--init``."""
        init = next((path for path in INITS if os.path.exists(path)), None)
        return ["--init"] if init is None else [f"--volume={init}:{INIT_PATH}:ro"]

    def init_exec(self) -> str:
        """The shell command that becomes the session's PID 1 once its folders are laid out:
        catatonit's pause mode, or a sleep under ``--init``."""
        return "exec sleep infinity" if "--init" in self.init_args() else f"exec {INIT_PATH} -P"

    def claim(self) -> None:
        """Before this process's first container: sweep what gone owners left, and start the
        reaper of this process's containers (once per process and engine)."""
        key = tuple(self.engine.argv)
        with _claim_lock:
            if key in _claimed and _claimed[key].poll() is None:
                return
            sweep_containers(self.engine)
            _claimed[key] = _start_reaper(self.engine, self.owner)


def sweep_containers(engine: ContainerEngine) -> list[str]:
    """Remove the containers whose owner is gone, each named in the log; their ids."""
    gone = {ident: owner for ident, owner in engine.owned_containers().items() if not alive(owner)}
    for ident, owner in gone.items():
        log.warning("removing container %s left by process %s (gone)", ident[:12], owner)
    engine.remove(list(gone))
    return list(gone)


def _start_reaper(engine: ContainerEngine, owner: str) -> subprocess.Popen[bytes]:
    """The reaper of ``owner``'s containers, following this process (ready when returned)."""
    return start_follower([sys.executable, "-s", str(REAPER), owner, *engine.argv])
