"""pytest for sandboxed commands, when the system's ``python3`` has none.

A sandbox shows the host's ``/usr`` and nothing of envhub's own environment, and system Pythons
rarely carry pytest. :func:`pytest_bundle` copies the installed pytest and its dependencies
(pure Python) once into a cache folder (``/var/tmp/envhub-<uid>/pytest-<version>``), which a
sandbox mounts read-only and puts on ``PYTHONPATH``. Where the system ``python3`` imports
pytest already, nothing is copied.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from importlib import metadata
from pathlib import Path

DISTRIBUTIONS = ("pytest", "pluggy", "iniconfig", "packaging")
"""pytest and what it imports on Python 3.11+."""
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
CACHE_PARENT = "/var/tmp"


@functools.lru_cache(maxsize=1)
def pytest_bundle() -> Path | None:
    """A folder holding pytest for the sandbox's ``python3``; ``None`` when that Python has its
    own pytest (or there is no ``python3``, or no pytest to copy)."""
    python = shutil.which("python3", path=SYSTEM_PATH)
    if python is None or _imports_pytest(python):
        return None
    try:
        version = metadata.version("pytest")
    except metadata.PackageNotFoundError:
        return None
    folder = _cache_root() / f"pytest-{version}"
    if not folder.is_dir():
        _build(folder)
    return folder


def _imports_pytest(python: str) -> bool:
    done = subprocess.run(
        [python, "-I", "-c", "import pytest"], capture_output=True, timeout=60, check=False
    )
    return done.returncode == 0


def _cache_root() -> Path:
    """``/var/tmp/envhub-<uid>``: outside the home folder, which the sandbox's uid may not enter
    (bubblewrap mounts the bundle as that uid), and outside ``/tmp``, which a sandbox replaces
    with its own. Trusted only when it is ours and no one else can write to it; another
    user's folder of that name is never used."""
    root = Path(CACHE_PARENT) / f"envhub-{os.geteuid()}"
    root.mkdir(mode=0o755, exist_ok=True)
    info = root.lstat()
    if root.is_symlink() or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise PermissionError(f"{root} is not a folder of this user's that only it can write")
    return root


def _build(folder: Path) -> None:
    """Copy the distributions' files into ``folder`` (built aside, then renamed into place, so
    a concurrent build or a crash never leaves half a bundle)."""
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        for name in DISTRIBUTIONS:
            _copy_distribution(metadata.distribution(name), staging)
        for path in (staging, *staging.rglob("*")):  # readable by the sandbox's own uid
            path.chmod(0o755 if path.is_dir() else 0o644)
        staging.rename(folder)
    except OSError:
        if not folder.is_dir():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _copy_distribution(dist: metadata.Distribution, target: Path) -> None:
    for file in dist.files or ():
        if file.parts[0] == ".." or "__pycache__" in file.parts or file.suffix == ".pyc":
            continue  # console scripts live outside site-packages; bytecode is rebuilt
        source = Path(str(dist.locate_file(file)))
        if source.is_file():
            destination = target / file
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, destination)
