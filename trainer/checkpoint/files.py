"""Atomic file operations: stage in a ``.tmp-`` folder, fsync, rename into place.

Every temporary name ends in ``-<pid>`` of the process writing it, so :func:`clean_stale` can
tell the leftovers of a dead process from the work of a live one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

from envhub.lifetime.procs import exists

# One logger for the package, named as before it was split into modules (see ``rng``).
log = logging.getLogger(__package__)

_TMP_PID = re.compile(r"\.tmp-.*-(\d+)")


@contextlib.contextmanager
def staging(tmp: Path) -> Iterator[Path]:
    """A fresh temporary folder, removed if the block fails.

    A kill leaves it behind for :func:`clean_stale`.

    Args:
        tmp: The folder to create; whatever is there already is removed first.

    Yields:
        ``tmp``.
    """
    remove(tmp)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        remove(tmp)
        raise


def clean_stale(folder: Path, pattern: str) -> None:
    """Delete ``.tmp-`` leftovers of saves that died (their process is gone) or failed.

    Args:
        folder: The folder to look in.
        pattern: A glob for the leftovers, e.g. ``".tmp-*"``.
    """
    for entry in folder.glob(pattern):
        match = _TMP_PID.fullmatch(entry.name)
        pid = int(match.group(1)) if match else None
        if pid is not None and pid != os.getpid() and exists(pid):
            continue  # another live process is writing there
        log.info("removing %s, left by an interrupted save", entry)
        remove(entry)


def replace_dir(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst``; an existing ``dst`` is first renamed aside, then deleted.

    ``os.replace`` cannot replace a non-empty folder, hence the detour.

    Args:
        src: The finished folder.
        dst: Where it goes.
    """
    old = dst.parent / f".tmp-old-{dst.name}-{os.getpid()}"
    if dst.exists():
        os.replace(dst, old)
    os.replace(src, dst)
    fsync(dst.parent)
    remove(old)


def write_text_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with a file holding ``text``: readers see the old or the new, never half.

    Args:
        path: The file to write.
        text: Its new content.
    """
    tmp = path.parent / f".tmp-{path.name}-{os.getpid()}"
    write_synced(tmp, text)
    os.replace(tmp, path)
    fsync(path.parent)


def write_synced(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` and fsync it before returning.

    Args:
        path: The file to write.
        text: Its content (UTF-8).
    """
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def fsync_tree(root: Path) -> None:
    """Fsync every file and folder under ``root``, ``root`` included, deepest first.

    Args:
        root: The folder to make durable.
    """
    for directory, _, names in os.walk(root, topdown=False):
        for name in names:
            fsync(Path(directory) / name)
        fsync(Path(directory))


def fsync(path: Path) -> None:
    """Fsync one file or folder (folders are skipped on Windows).

    Args:
        path: The file or folder.
    """
    if os.name == "nt" and path.is_dir():  # Windows cannot open a folder to fsync it
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove(path: Path) -> None:
    """Delete a file, link or folder tree if it exists; never raises for a missing one.

    Args:
        path: What to delete.
    """
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink(missing_ok=True)
