"""The weaker ``isolation="rlimits"`` fallback, for machines without user namespaces.

A run is ``[prlimit <limits> --] <uid drop> env -i <ENV> /bin/sh -c <init> sh <command>`` in a
temporary folder of the host (:func:`fallback_argv`): the same rlimits and uid drop as a
bubblewrap run (:mod:`envhub.sandbox.jail`). Memory, CPU, processes, file size, output and wall
time are limited; host files and the network are NOT protected: the run sees the host's file
system as its uid may (the caller's ``/proc/PID/environ`` too, where it runs as the caller's
uid) and the host's network. It is never chosen automatically:
``LocalSandbox(isolation="rlimits")`` asks for it.

The call's files are written into the folder (owned by the run's uid, as root) and the output
files read back from it after the run (:func:`read_back`).
"""

from __future__ import annotations

import os
from pathlib import Path

from envhub.sandbox.base import Limits
from envhub.sandbox.jail import ENV, Jail, prefix_argv
from envhub.sandbox.outputs import ALL_FILES, frame, init_script


def write_inputs(root: Path, inputs: dict[str, bytes], uid: int, as_root: bool) -> None:
    """Write the call's files into ``root``; as root, ``root`` and all in it then belong to
    ``uid``."""
    for path, data in inputs.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    if as_root:
        for path in [root, *root.rglob("*")]:
            os.chown(path, uid, uid)


def fallback_argv(
    jail: Jail, uid: int, limits: Limits, folder: str, command: list[str]
) -> list[str]:
    """The argv of a run of ``command`` as ``uid`` in ``folder`` (its home and temp folder)."""
    env_argv = [
        "env",
        "-i",
        *[f"{k}={v}" for k, v in {**ENV, "HOME": folder, "TMPDIR": folder}.items()],
    ]
    # As root the run has a uid of its own, so its init may kill all that uid's processes.
    init = ["/bin/sh", "-c", init_script(kill_all=jail.as_root), "sh"]
    return [*prefix_argv(jail, uid, limits), *env_argv, *init, *command]


def read_back(root: Path, wanted: list[str]) -> bytes:
    """The ``wanted`` files of ``root`` (every file for ``[ALL_FILES]``; links skipped), framed
    as the bubblewrap runs' init sends them (:func:`~envhub.sandbox.outputs.frame`)."""
    found = {}
    if wanted == [ALL_FILES]:
        wanted = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    for path in wanted:
        target = root / path
        if target.is_file() and not target.is_symlink():
            found[path] = target.read_bytes()
    return frame(found)
