"""pytest for sandboxed commands, when the system's ``python3`` has none.

A sandbox shows the host's ``/usr`` and nothing of envhub's own environment, and system Pythons
rarely carry pytest. :func:`pytest_bundle` copies the installed pytest and its dependencies
(pure Python) once into a cache folder (``/var/tmp/envhub-<uid>/pytest-<version>-<tag>``, the
tag that of the system ``python3``'s bytecode, ``cpython-311``), compiles them there with that
``python3``, and a sandbox mounts the folder read-only and puts it on ``PYTHONPATH``. The
bytecode is compiled once: a sandboxed ``python3`` cannot write it into the read-only mount, and
without it every pytest run in a sandbox compiled pytest from source again (about half of a
small suite's run). Where the system ``python3`` imports pytest already, nothing is copied.
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
    if python is None:
        return None
    has_pytest, tag = _inspect(python)
    if has_pytest:
        return None
    try:
        version = metadata.version("pytest")
    except metadata.PackageNotFoundError:
        return None
    folder = _cache_root() / f"pytest-{version}-{tag}"
    if not folder.is_dir():
        _build(folder, python)
    return folder


def _inspect(python: str) -> tuple[bool, str]:
    """Whether ``python`` imports pytest, and its bytecode's cache tag (``cpython-311``)."""
    script = "import sys; print(sys.implementation.cache_tag, flush=True); import pytest"
    done = subprocess.run(
        [python, "-I", "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    return done.returncode == 0, done.stdout.strip() or "unknown"


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


def _build(folder: Path, python: str) -> None:
    """Copy the distributions' files into ``folder`` and compile them with ``python`` (built
    aside, then renamed into place, so a concurrent build or a crash never leaves half a
    bundle)."""
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        for name in DISTRIBUTIONS:
            _copy_distribution(metadata.distribution(name), staging)
        _compile(staging, python)
        for path in (staging, *staging.rglob("*")):  # readable by the sandbox's own uid
            path.chmod(0o755 if path.is_dir() else 0o644)
        staging.rename(folder)
    except OSError:
        if not folder.is_dir():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _compile(folder: Path, python: str) -> None:
    """Write the bytecode of every module in ``folder`` for ``python``. A module it cannot
    compile is left to be compiled on import, as before: bytecode only saves time."""
    subprocess.run(
        [python, "-I", "-m", "compileall", "-q", str(folder)],
        capture_output=True,
        timeout=300,
        check=False,
    )


def _copy_distribution(dist: metadata.Distribution, target: Path) -> None:
    for file in dist.files or ():
        if file.parts[0] == ".." or "__pycache__" in file.parts or file.suffix == ".pyc":
            continue  # console scripts live outside site-packages; bytecode is compiled after
        source = Path(str(dist.locate_file(file)))
        if source.is_file():
            destination = target / file
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, destination)
