"""Which Harbor environments run here, read from ``environment/Dockerfile`` (no Docker needed).

envhub runs a Harbor task in its bubblewrap sandbox, which shows the host's ``/usr`` read-only:
a task runs here when its image *is* the host's base system. The rule:

- no ``environment/`` folder, or no Dockerfile and no ``docker_image`` in ``task.toml``: the host's
  base system;
- a Dockerfile (or ``docker_image``) whose one ``FROM`` image is the host's distribution at its
  version (``debian:12``, ``debian:bookworm``, ``debian:bookworm-slim`` on Debian 12; likewise for
  Ubuntu and others, from ``/etc/os-release``), or the official ``python`` image at the version of
  the sandbox's ``python3`` (``python:3.11``, ``python:3.11-slim``, ``python:3.11-slim-bookworm``
  where it is 3.11 on bookworm);
- after ``FROM``, only steps that need no build: ``WORKDIR``, ``COPY``/``ADD`` of files from the
  build context into the working folder, ``ENV``; ``ARG``, ``LABEL``, ``USER``, ``EXPOSE``,
  ``CMD``, ``ENTRYPOINT``, ``SHELL``, ``HEALTHCHECK``, ``STOPSIGNAL`` and ``VOLUME`` are ignored.

Anything else (another image, a ``RUN`` step, a second stage, a ``docker-compose.yaml``, a copy
to outside the working folder or from a URL) is refused with an error naming the image and the
line: it needs a container build that cannot happen here.
"""

from __future__ import annotations

import functools
import json
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from envhub.errors import EnvLoadError

DEFAULT_WORKDIR = "/app"
"""Harbor's usual working folder, when the Dockerfile sets none."""
_IGNORED = {
    "ARG", "LABEL", "USER", "EXPOSE", "CMD", "ENTRYPOINT", "SHELL", "HEALTHCHECK", "STOPSIGNAL",
    "VOLUME", "MAINTAINER",
}  # fmt: skip


class UnsupportedEnvironment(EnvLoadError):
    """A task whose environment needs a container image that cannot be built here."""


@dataclass
class Environment:
    """What a task's environment amounts to here: its files, working folder and variables."""

    image: str | None = None
    workdir: str = DEFAULT_WORKDIR
    copies: list[tuple[str, str]] = field(default_factory=list)
    """(source in the build context, destination relative to the working folder)."""
    env: dict[str, str] = field(default_factory=dict)


def read_dockerfile(path: Path) -> Environment:
    """The environment a Dockerfile describes, if it runs here.

    Raises:
        UnsupportedEnvironment: The image or a step needs a container build (named).
    """
    environment = Environment()
    froms = 0
    for number, line in _instructions(path.read_text(encoding="utf-8", errors="replace")):
        word, _, rest = line.partition(" ")
        keyword, rest = word.upper(), rest.strip()
        where = f"{path}:{number}"
        if keyword == "FROM":
            froms += 1
            if froms > 1:
                raise _refuse(environment.image, where, "a multi-stage build (a second FROM)")
            environment.image = _from_image(rest)
            check_image(environment.image, where)
        elif keyword == "WORKDIR":
            environment.workdir = str(PurePosixPath(environment.workdir, rest.strip("\"'")))
        elif keyword in ("COPY", "ADD"):
            environment.copies.extend(_copies(environment, rest, where))
        elif keyword == "ENV":
            environment.env.update(_env_pairs(rest))
        elif keyword not in _IGNORED:
            raise _refuse(environment.image, where, f"a {keyword} step")
    return environment


def check_image(image: str, where: str) -> None:
    """Accept ``image`` when it is the host's base system (see the module docstring).

    Raises:
        UnsupportedEnvironment: Any other image.
    """
    if _normalize(image) not in host_images():
        raise UnsupportedEnvironment(
            f"{where}: the image {image!r} cannot be built here; envhub runs Harbor tasks in its "
            f"bubblewrap sandbox on the host's system, so the image must be one of "
            f"{', '.join(sorted(host_images())[:6])}, ... (or leave the environment out)"
        )


@functools.lru_cache(maxsize=1)
def host_images() -> frozenset[str]:
    """Image names that stand for this machine's base system and the sandbox's Python."""
    release = _os_release()
    names: set[str] = set()
    distro, version, codename = (
        release.get(k, "") for k in ("ID", "VERSION_ID", "VERSION_CODENAME")
    )
    for tag in filter(None, (version, codename)):
        names.update({f"{distro}:{tag}", f"{distro}:{tag}-slim"})
    python = sandbox_python_version()
    if python:
        suffixes = ["", "-slim"] + ([f"-{codename}", f"-slim-{codename}"] if codename else [])
        for suffix in suffixes:
            names.add(f"python:{python}{suffix}")
    return frozenset(names)


@functools.lru_cache(maxsize=1)
def sandbox_python_version() -> str | None:
    """``X.Y`` of the ``python3`` a sandboxed command finds, or ``None`` if there is none."""
    python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    if python is None:
        return None
    done = subprocess.run(
        [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return done.stdout.strip() or None


def _os_release() -> dict[str, str]:
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return {}
    pairs = (line.partition("=") for line in text.splitlines() if "=" in line)
    return {key: value.strip().strip('"') for key, _, value in pairs}


def _normalize(image: str) -> str:
    """``docker.io/library/debian:12@sha256:...`` -> ``debian:12``."""
    image = image.split("@", 1)[0]
    for prefix in ("docker.io/library/", "library/", "docker.io/"):
        if image.startswith(prefix):
            image = image[len(prefix) :]
    return image if ":" in image else f"{image}:latest"


def _instructions(text: str) -> list[tuple[int, str]]:
    """(first line number, instruction) pairs: continuations joined, comments dropped."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append((start, (pending + line).strip()))
        pending = ""
    if pending.strip():
        out.append((start, pending.strip()))
    return out


def _from_image(rest: str) -> str:
    words = [w for w in rest.split() if not w.startswith("--")]
    if not words:
        raise EnvLoadError(f"a FROM without an image: {rest!r}")
    return words[0]


def _copies(environment: Environment, rest: str, where: str) -> list[tuple[str, str]]:
    if rest.startswith("["):
        try:
            words = [str(w) for w in json.loads(rest)]
        except ValueError as e:
            raise EnvLoadError(f"{where}: cannot read the COPY's JSON form: {e}") from None
    else:
        words = [w for w in shlex.split(rest) if not w.startswith("--")]
    if any(w.startswith("--from") for w in rest.split()) or len(words) < 2:
        raise _refuse(environment.image, where, "a COPY from another stage or image")
    *sources, dest = words
    target = PurePosixPath(environment.workdir, dest)
    try:
        relative = target.relative_to(environment.workdir)
    except ValueError:
        raise _refuse(
            environment.image, where, f"a copy to {dest}, outside the working folder"
        ) from None
    for source in sources:
        if "://" in source:
            raise _refuse(environment.image, where, f"a download ({source})")
    into_folder = dest.endswith("/") or len(sources) > 1 or str(relative) == "."
    return [(s, str(relative) + ("/" if into_folder else "")) for s in sources]


def _env_pairs(rest: str) -> dict[str, str]:
    words = shlex.split(rest)
    if words and "=" not in words[0]:  # the old form: ENV KEY value with spaces
        return {words[0]: " ".join(words[1:])}
    return dict(w.split("=", 1) for w in words if "=" in w)


def _refuse(image: str | None, where: str, what: str) -> UnsupportedEnvironment:
    return UnsupportedEnvironment(
        f"{where}: the image {image or '(none)'!r} needs {what}, which needs a container build; "
        "envhub runs Harbor tasks on the host's base system in its bubblewrap sandbox "
        "(see envhub.harbor.dockerfile for what runs)"
    )
