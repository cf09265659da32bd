"""Where a Harbor task's paths are in a sandbox session: at their own place, or mapped.

Harbor's container has the task's working folder (``[environment] workdir`` of ``task.toml``,
else the Dockerfile's ``WORKDIR``, else ``/app``), the tests at ``/tests``, the solution at
``/solution`` and the reward at ``/logs/verifier``. A session has its working folder at
``/sandbox``; what else it shows depends on its backend:

- **Shown** (the local backend: :class:`~envhub.sandbox.session.SessionPaths`): the session
  shows the working folder again at the task's own path (``/app`` and ``/sandbox`` hold the same
  files), and ``/tests``, ``/solution`` and ``/logs`` are empty folders of its own. Nothing is
  rewritten: the instruction, the Dockerfile's ``ENV`` values, ``tests/`` and ``solution/`` run
  as written, and ``test.sh``, ``solve.sh`` and the model's commands start in the working
  folder, as in Harbor (the model's file tools take paths under it too). A
  working folder the backend cannot show (under ``/usr``, say) is mapped alone, as below.
- **Mapped** (the fallback, for backends that show no other folder: e2b, a remote one):
  the working folder is ``/sandbox``, the solution ``/sandbox/.harbor/solution``, the tests
  and the reward ``/tmp/.harbor/tests`` and ``/tmp/.harbor/logs/verifier``
  (:data:`VERIFIER_DIR`; ``/sandbox/.harbor`` where ``/tmp`` may not last from one command to
  the next: a backend other than the local one), and those paths are rewritten where they
  stand whole (:func:`~envhub.harbor.task.rewrite_paths`) in the instruction, the ``ENV``
  values and the text files of ``tests/`` and ``solution/``.

Either way the tests are out of the model's reach until the episode ends, as Harbor uploads
them only then: the verifier ends what the model left running, then empties the tests' and the
logs' folders (:attr:`Layout.fresh`: whatever the model planted there goes) and copies
``tests/`` in. They stay out of ``/sandbox`` for the reason Harbor keeps ``/tests`` out of
``/app``: a test runner reads configuration from the folders above its tests (pytest:
``pytest.ini``, ``conftest.py``, ...), and the workspace is the model's to write. Above
``/tests`` there is only the read-only ``/``; above ``/tmp/.harbor`` only ``/tmp``, which the
verifier clears of such files first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from envhub.sandbox.base import WORKDIR, Sandbox
from envhub.sandbox.session import SessionPaths

SHOWN_FOLDERS = ("/tests", "/solution", "/logs")
"""Harbor's folders a session shows empty (the tests go in when they run)."""
HARBOR_DIR = f"{WORKDIR}/.harbor"
"""Where a mapped solution goes, in the workspace (and a mapped verifier off the local
backend)."""
SOLUTION_DIR = f"{HARBOR_DIR}/solution"
VERIFIER_DIR = "/tmp/.harbor"
"""Where a mapped verifier's tests and reward go on the local backend, out of the workspace."""


@dataclass(frozen=True)
class Layout:
    """Where one task's Harbor paths are in the sessions of one sandbox."""

    workdir: str
    """The folder ``test.sh``, ``solve.sh`` and the model's commands start in (the task's own,
    or ``/sandbox``)."""
    tests: str
    logs: str
    """Harbor's ``/logs/verifier``: where ``test.sh`` writes the reward."""
    solution: str
    fresh: tuple[str, ...]
    """Folders the verifier empties before it copies the tests in."""
    paths: SessionPaths = field(default_factory=SessionPaths)
    """What the session is asked to show (nothing: the mapped fallback)."""
    mapping: dict[str, str] = field(default_factory=dict)
    """Harbor path -> session path, for each path the session does not show: rewritten in
    the instruction, the ``ENV`` values, ``tests/`` and ``solution/``."""

    @property
    def shown(self) -> bool:
        """Whether the session shows Harbor's folders at their own paths."""
        return bool(self.paths.folders)


def layout_for(workdir: str, sandbox: Sandbox) -> Layout:
    """The layout of a task whose working folder is ``workdir`` in ``sandbox``'s sessions:
    shown where the backend can show Harbor's folders, else mapped (see the module
    docstring)."""
    if any(sandbox.session_path_problem(path) for path in SHOWN_FOLDERS):
        return _mapped(workdir, sandbox)
    shows_workdir = (
        workdir != "/"
        and sandbox.session_path_problem(workdir) is None
        and not any(_meet(workdir, folder) for folder in SHOWN_FOLDERS)
    )
    return Layout(
        workdir=workdir if shows_workdir else WORKDIR,
        tests="/tests",
        logs="/logs/verifier",
        solution="/solution",
        fresh=("/tests", "/logs"),
        paths=SessionPaths(workdir=(workdir,) if shows_workdir else (), folders=SHOWN_FOLDERS),
        mapping={} if shows_workdir else _workdir_mapping(workdir),
    )


def _mapped(workdir: str, sandbox: Sandbox) -> Layout:
    # A local session's /tmp lasts the session; elsewhere it may not last one command.
    folder = VERIFIER_DIR if sandbox.backend == "local" else HARBOR_DIR
    tests, logs = f"{folder}/tests", f"{folder}/logs/verifier"
    mapping = {"/tests": tests, "/logs/verifier": logs, "/solution": SOLUTION_DIR}
    return Layout(
        workdir=WORKDIR,
        tests=tests,
        logs=logs,
        solution=SOLUTION_DIR,
        fresh=(folder,),
        mapping={**mapping, **_workdir_mapping(workdir)},
    )


def _workdir_mapping(workdir: str) -> dict[str, str]:
    """The working folder to ``/sandbox`` (none for ``/``: its files are the workspace's)."""
    return {} if workdir in ("/", "") else {workdir: WORKDIR}


def _meet(path: str, other: str) -> bool:
    """Whether one of two absolute paths is the other or inside it."""
    return (path + "/").startswith(other + "/") or (other + "/").startswith(path + "/")
