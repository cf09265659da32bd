"""The prepared verifier toolchain: the published verifier preamble, run without the network.

Most published Harbor (terminal-bench) tasks' ``tests/test.sh`` start the same way:
``apt-get install -y curl``, the uv installer by ``curl ... | sh``, then ``uvx -p 3.13 -w
pytest==8.4.1 -w pytest-json-ctrf==0.3.5 pytest ...`` (or ``uv init``/``uv add``/``uv run``,
``uv venv``/``uv pip install``, ``pip install``). In a container episode the network is off at
verify time, so envhub prepares, once, on the host, a folder that answers those downloads:

- ``bin/uv``, ``bin/uvx``: uv's static (musl) build, from the ``uv`` wheel on the package
  index, which runs in any x86-64 image;
- ``wheels/``: the packages the tests ask for (pytest and pytest-json-ctrf always; each
  ``-w``/``--with``, ``uv add``, ``uv pip install`` and ``pip install`` requirement of the
  script), binary wheels for the image's Python;
- ``shims/`` and ``installer.sh``: see :mod:`envhub.harbor.verifier_shims`.

The container back end mounts it read-only at :data:`~envhub.harbor.verifier_shims.MOUNT` in
every session of the task (a command cannot add a mount to a running container; the model's
commands do not have it on their ``PATH``, only the verifier's call does), and the task is not
edited. What the toolchain cannot answer is refused before any episode
(:func:`offline_problems`): a download of another address, a ``git clone`` of a remote, a
requirement the package index does not have as a wheel, an ``apt-get install`` of a package
the image lacks (checked once the image is built).
"""

from __future__ import annotations

import fcntl
import json
import re
import shlex
import subprocess
import sys
import zipfile
from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from envhub.harbor.dockerfile import UnsupportedEnvironment
from envhub.harbor.verifier_needs import ADVICE, ScriptNeeds, check_offline, read_needs
from envhub.harbor.verifier_shims import MOUNT, shims
from envhub.paths import cache_dir

if TYPE_CHECKING:
    from envhub.harbor.task import HarborTask
    from envhub.sandbox.container import ContainerSandbox

DEFAULT_REQUIREMENTS = ("pytest==8.4.1", "pytest-json-ctrf==0.3.5")
"""Always in the wheels: what the published preamble runs."""
OLDEST_GLIBC = 17
"""manylinux2014's glibc (2.17): the oldest wheels the toolchain takes."""
DEFAULT_GLIBC = 36
"""The glibc minor version assumed of an image that does not say (Debian 12's 2.36)."""


def platforms(glibc: int) -> list[str]:
    """The wheel platform tags an x86-64 image with glibc ``2.<glibc>`` runs: every
    ``manylinux_2_N`` from 2.17 up to it (a package may publish only newer ones: numpy 2.4)."""
    return [f"manylinux_2_{n}_x86_64" for n in range(glibc, OLDEST_GLIBC - 1, -1)]


_PLATFORM_MARKER = re.compile(r"sys_platform|platform_system|os_name")


def toolchain_dir() -> Path:
    """The toolchain's folder on the host (in envhub's cache)."""
    return cache_dir() / "verifier-toolchain"


def prepare_toolchain(requirements: Iterable[str], python: str, glibc: int = DEFAULT_GLIBC) -> Path:
    """The toolchain's folder, with uv, the shims and wheels of ``requirements`` (and
    :data:`DEFAULT_REQUIREMENTS`) for Python ``python`` (``3.11``) on glibc ``2.<glibc>``:
    fetched once, kept.

    Raises:
        UnsupportedEnvironment: A requirement has no wheel on the package index (or the index
            cannot be reached).
    """
    folder = toolchain_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with _locked(folder / ".lock"):
        if not (folder / "bin" / "uv").is_file():
            _install_uv(folder)
        _write_shims(folder)
        done_file = folder / "fetched.json"
        done = set(json.loads(done_file.read_text())) if done_file.is_file() else set()
        key = f"py{python} glibc2.{glibc}"
        wanted = [r for r in dict.fromkeys([*DEFAULT_REQUIREMENTS, *requirements])
                  if f"{r} {key}" not in done]  # fmt: skip
        if wanted:
            _download(wanted, python, folder / "wheels", platforms(glibc))
            done |= {f"{r} {key}" for r in wanted}
            done_file.write_text(json.dumps(sorted(done), indent=1))
    return folder


def toolchain_for(task: HarborTask, sandbox: ContainerSandbox, image: str) -> Path | None:
    """The toolchain ``task``'s verifier needs in ``image`` (prepared now if need be), or
    ``None`` when its tests fetch nothing.

    Raises:
        UnsupportedEnvironment: The tests install a Debian package the image lacks, or run
            Python packages in an image without Python, or need a wheel the index lacks.
    """
    needs = task.verifier_needs
    if needs is None or not needs.uses:
        return None
    python, missing, glibc = image_facts(sandbox, image, needs.apt_packages)
    where = task.path / "tests"
    if missing:
        raise UnsupportedEnvironment(
            f"{where}: apt-get install {' '.join(missing)}: not in the task's image; {ADVICE}"
        )
    if not python and needs.requirements:
        raise UnsupportedEnvironment(
            f"{where}: the tests install {needs.requirements[0]}, and the task's image has no "
            f"python3 to run it (uv would download one); {ADVICE}"
        )
    return prepare_toolchain(needs.requirements, python or "3.11", glibc)


def image_facts(
    sandbox: ContainerSandbox, image: str, packages: tuple[str, ...]
) -> tuple[str, list[str], int]:
    """The image's Python version (``3.11``; ``""`` when it has none), which of ``packages``
    it lacks, and its glibc's minor version (:data:`DEFAULT_GLIBC` when it does not say),
    from one container of it."""
    from envhub._async import run_sync

    quoted = " ".join(shlex.quote(p) for p in packages)
    script = (
        "python3 -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])' 2>/dev/null || echo; "
        "getconf GNU_LIBC_VERSION 2>/dev/null || echo; "
        f"for p in {quoted}; do case $p in curl|wget|ca-certificates) continue;; esac; "
        "dpkg-query -W -f='${Status}' \"$p\" 2>/dev/null | grep -q 'install ok installed' "
        '|| echo "$p"; done'
    )
    result = run_sync(sandbox.with_image(image).arun(["/bin/sh", "-c", script]))
    lines = [*result.stdout.splitlines(), "", ""]
    glibc = re.fullmatch(r"glibc 2\.(\d+)", lines[1].strip())
    minor = max(int(glibc.group(1)), OLDEST_GLIBC) if glibc else DEFAULT_GLIBC
    return lines[0].strip(), [line for line in lines[2:] if line.strip()], minor


def _install_uv(folder: Path) -> None:
    """uv's static build, out of its musllinux wheel, into ``folder/bin``."""
    wheels = folder / "uv-wheel"
    _pip_download(["uv"], "3.11", wheels, platform="musllinux_1_1_x86_64", deps=False)
    wheel = next(wheels.glob("uv-*.whl"))
    (folder / "bin").mkdir(exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            name = member.rsplit("/", 1)[-1]
            if ".data/scripts/" in member and name in ("uv", "uvx"):
                target = folder / "bin" / name
                target.write_bytes(archive.read(member))
                target.chmod(0o755)
    wheel.unlink()


def _write_shims(folder: Path) -> None:
    for name, text in shims().items():
        path = folder / name
        path.parent.mkdir(exist_ok=True)
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
        path.chmod(0o755)


def _download(requirements: list[str], python: str, wheels: Path, tags: list[str]) -> None:
    """Wheels of ``requirements`` (and their dependencies) for Python ``python`` on the
    platform ``tags``."""
    try:
        _pip_download(requirements, python, wheels, platform=tags, deps=True)
        # uv locks a project for every platform: other platforms' dependencies (pytest's
        # colorama) must be in the wheels too. Best effort: what fails is not run here.
        others = _other_platform_requirements(wheels)
        if others:
            _pip_download(others, python, wheels, platform=tags, deps=False, check=False)
    except UnsupportedEnvironment:
        for requirement in requirements:  # which one: the message names it
            _pip_download([requirement], python, wheels, platform=tags, deps=True)
        raise


def _other_platform_requirements(wheels: Path) -> list[str]:
    """The requirements the wheels in ``wheels`` have only on other platforms (a
    ``Requires-Dist`` with a ``sys_platform``/``platform_system``/``os_name`` marker)."""
    found: set[str] = set()
    for wheel in wheels.glob("*.whl"):
        with zipfile.ZipFile(wheel) as archive:
            name = next((n for n in archive.namelist() if n.endswith(".dist-info/METADATA")), None)
            text = archive.read(name).decode("utf-8", "replace") if name else ""
        for line in text.splitlines():
            if line.startswith("Requires-Dist:") and ";" in line:
                requirement, marker = line.split(":", 1)[1].split(";", 1)
                if _PLATFORM_MARKER.search(marker) and "extra" not in marker:
                    found.add(requirement.strip().replace(" ", ""))
    return sorted(found)


def _pip_download(
    requirements: list[str],
    python: str,
    dest: Path,
    *,
    platform: str | list[str],
    deps: bool,
    check: bool = True,
) -> None:
    tags = [platform] if isinstance(platform, str) else platform
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
        "--only-binary=:all:", *(f"--platform={tag}" for tag in tags),
        f"--python-version={python}", "-d", str(dest),
        *([] if deps else ["--no-deps"]), *requirements,
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if result.returncode != 0 and check:
        errors = [line for line in result.stderr.splitlines() if "ERROR" in line]
        tail = (errors[-1] if errors else result.stderr.strip()[-300:]) or "no output"
        raise UnsupportedEnvironment(
            f"the verifier toolchain cannot fetch {' '.join(requirements)} for Python {python} "
            f"as wheels from the package index ({tail}); {ADVICE}"
        )


@contextmanager
def _locked(path: Path):
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


__all__ = [
    "DEFAULT_REQUIREMENTS",
    "MOUNT",
    "ScriptNeeds",
    "check_offline",
    "image_facts",
    "prepare_toolchain",
    "read_needs",
    "toolchain_for",
    "toolchain_dir",
]
