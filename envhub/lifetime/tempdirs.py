"""Temporary folders that a killed process does not leave for good.

A folder made by :func:`owned_tempdir` carries its maker's pid in its name
(``PREFIX<pid>-<random>``). Before making one, the folders of the same prefix whose maker is
gone are removed: whatever killed a process (SIGKILL, an out-of-memory killer) skipped its own
clean-up, and the next process of the same kind does it instead.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from envhub.lifetime import procs


def owned_tempdir(prefix: str, directory: str | None = None) -> str:
    """A new folder ``PREFIX<pid>-<random>`` in ``directory`` (default: the temp folder), after
    removing the ones of ``prefix`` whose process is gone."""
    parent = Path(directory or tempfile.gettempdir())
    remove_orphans(parent, prefix)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent)


def remove_orphans(parent: Path, prefix: str) -> list[Path]:
    """Remove the folders ``PREFIX<pid>-*`` in ``parent`` whose process has exited; returns
    them."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)-")
    removed = []
    for path in parent.glob(f"{prefix}*"):
        match = pattern.match(path.name)
        if match and path.is_dir() and not procs.exists(int(match.group(1))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
