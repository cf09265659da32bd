"""The few host files under ``/etc`` a local sandbox sees, prepared once per process.

Programs in the sandbox need the dynamic linker's cache and configuration, the alternatives
links and the time zone. Binding each from the host costs bubblewrap a mount and a read of the
whole mount table per file, so they are copied once into a folder that each sandbox binds as its
``/etc`` in one mount (about 0.6 ms less per run on a 2-core machine). The folder also holds empty
mount points for the files bound on top of it later (the network files of runs with network, a
user's extra read-only paths under ``/etc``): the copy is read-only inside the sandbox, so
bubblewrap could not create them there.

The copies are taken when the first sandbox of the process starts; a change on the host after
that (a new ``ld.so.cache``) reaches sandboxes of the next process.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
from collections.abc import Sequence

from envhub.lifetime.tempdirs import owned_tempdir

COPIED = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/localtime",
)
"""Host paths copied into the sandbox's ``/etc`` (those that exist)."""


@functools.lru_cache(maxsize=8)
def _prepared(mount_points: tuple[str, ...]) -> str:
    folder = owned_tempdir("envhub-sandbox-etc-")  # a killed process's is removed by the next
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    for path in COPIED:
        _copy(path, os.path.join(folder, os.path.relpath(path, "/etc")))
    for path in mount_points:
        _mount_point(path, os.path.join(folder, os.path.relpath(path, "/etc")))
    # The sandbox's uid reads it (bubblewrap binds it as that uid); nobody else may change it.
    for root, dirs, _ in os.walk(folder):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
    os.chmod(folder, 0o755)
    return folder


def prepared_etc(mount_points: Sequence[str] = ()) -> str:
    """The folder to bind as a sandbox's ``/etc``: copies of :data:`COPIED`, and an empty file
    or folder for each path of ``mount_points`` under ``/etc`` that exists on the host (those
    elsewhere are skipped). Made once per process and set of mount points; removed at exit."""
    inside = tuple(sorted(p for p in mount_points if p.startswith("/etc/")))
    return _prepared(inside)


def _copy(source: str, target: str) -> None:
    if os.path.islink(source):
        os.symlink(os.readlink(source), target)
    elif os.path.isdir(source):
        shutil.copytree(source, target, symlinks=True)
    elif os.path.isfile(source):
        shutil.copyfile(source, target)
        os.chmod(target, 0o644)


def _mount_point(source: str, target: str) -> None:
    if not os.path.exists(source) or os.path.lexists(target):
        return
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        with open(target, "w"):
            pass
        os.chmod(target, 0o644)
