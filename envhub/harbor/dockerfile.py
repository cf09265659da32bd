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
- after ``FROM``: ``WORKDIR``; ``COPY``/``ADD`` of files from the build context into the working
  folder; ``ENV`` and ``ARG`` (``$NAME`` and ``${NAME}`` expanded as Docker does, ``ARG`` only
  for the ``RUN`` steps); ``SHELL`` (the shell of later ``RUN`` steps); ``LABEL``, ``USER``,
  ``EXPOSE``, ``CMD``, ``ENTRYPOINT``, ``HEALTHCHECK``, ``STOPSIGNAL`` and ``VOLUME`` are
  ignored;
- ``RUN`` steps (shell form, run with ``/bin/sh -c`` or the ``SHELL``, or exec form), run once
  per task when its workspace is prepared (:mod:`envhub.harbor.build`): in a sandbox session
  without network, in order with the copies, in their ``WORKDIR`` (the working folder before
  any), with the ``ENV`` and ``ARG`` values set above them, the working folder's path rewritten
  to ``/sandbox``. Only the working folder and ``/tmp`` are writable there. Package installs
  are checked, not run (:mod:`envhub.harbor.installs`): ``apt-get`` / ``apt install`` of
  packages the host has (``dpkg-query``), ``pip`` / ``pip3`` / ``python3 -m pip install`` of
  distributions the sandbox's ``python3`` has (at a matching version when one is asked), pass
  as done; ``apt-get update``, ``clean`` and the like are no-ops.

Refused when the task loads, with an error naming the Dockerfile's line: another image, a
second stage, a ``docker-compose.yaml``, a copy to outside the working folder or from a URL, a
``RUN`` step in a ``WORKDIR`` outside the working folder, and a ``RUN`` step that can be told
to need the network or the system (:mod:`envhub.harbor.build_check`: an install of a package
the host lacks, a download, ``npm install``..., a write outside the working folder and
``/tmp``). A ``RUN`` step that fails when the workspace
is prepared is refused then, with its line and the end of its output.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import posixpath
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from envhub.errors import EnvLoadError
from envhub.sandbox.jail import ENV as SANDBOX_ENV

DEFAULT_WORKDIR = "/app"
"""Harbor's usual working folder, when neither the Dockerfile nor ``task.toml`` sets one."""
_IGNORED = {
    "LABEL", "USER", "EXPOSE", "CMD", "ENTRYPOINT", "HEALTHCHECK", "STOPSIGNAL", "VOLUME",
    "MAINTAINER", "ONBUILD",
}  # fmt: skip
DEFAULT_SHELL = ("/bin/sh", "-c")
CONTAINER_HINT = (
    "with Podman or Docker, run it in its own image: sandbox=container (`envhub check TASK "
    "--sandbox container`; an image that cannot be pulled here: --image-map IMAGE=STAND_IN)"
)
"""How a refusal ends: the container back end runs what bubblewrap cannot."""
_FROM = re.compile(r"^(\s*FROM\s+(?:--\S+\s+)*)(\S+)(.*)$", re.IGNORECASE | re.MULTILINE)
_COPY_FROM = re.compile(r"^(\s*(?:COPY|ADD)\s+(?:--\S+\s+)*?--from=)(\S+)()", re.I | re.M)
_STAGE = re.compile(r"^\s*FROM\s+(?:--\S+\s+)*\S+\s+AS\s+(\S+)", re.IGNORECASE | re.MULTILINE)
_VARIABLE = re.compile(r"\$(?:\{(\w+)(?::?-([^}]*))?\}|(\w+))")


class UnsupportedEnvironment(EnvLoadError):
    """A task whose environment needs a container image that cannot be built here."""


@dataclass
class Environment:
    """What a task's environment amounts to here: its files, working folder and variables."""

    image: str | None = None
    workdir: str = DEFAULT_WORKDIR
    copies: list[tuple[str, str]] = field(default_factory=list)
    """(source in the build context, destination relative to the (final) working folder; a
    folder when it ends with ``/``)."""
    env: dict[str, str] = field(default_factory=dict)
    runs: list[RunInstruction] = field(default_factory=list)
    """The ``RUN`` steps, in order (each knows how many copies come before it)."""
    explicit_workdir: bool = False
    """Whether a ``WORKDIR`` was set (``RUN`` steps before any run in the working folder)."""


@dataclass(frozen=True)
class RunInstruction:
    """One ``RUN`` step as the Dockerfile wrote it, with what was in force above it."""

    where: str
    """``path:line`` of the step."""
    text: str
    """The step as written (after ``RUN`` and its options)."""
    argv: tuple[str, ...]
    """The command: the shell and ``text`` (shell form), or the exec form's words."""
    workdir: str | None
    """The absolute ``WORKDIR`` it runs in (``None``: none set yet: the working folder)."""
    env: dict[str, str]
    """``ENV`` and ``ARG`` values set above it."""
    after_copies: int
    """How many of the environment's copies happen before it."""


def read_dockerfile(path: Path, workdir: str = DEFAULT_WORKDIR) -> Environment:
    """The environment a Dockerfile describes, if it runs here; ``workdir``: the working
    folder before any ``WORKDIR`` (``task.toml``'s ``[environment] workdir``, else ``/app``).

    Raises:
        UnsupportedEnvironment: The image or a step needs a container build (named).
    """
    environment = Environment(workdir=workdir)
    froms, build_args, shell = 0, {}, DEFAULT_SHELL
    copy_lines: list[str] = []
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
            folder = expand(rest.strip("\"'"), {**build_args, **environment.env})
            environment.workdir = str(PurePosixPath(environment.workdir, folder))
            environment.explicit_workdir = True
        elif keyword in ("COPY", "ADD"):
            copies = _copies(environment, rest, where)
            environment.copies.extend(copies)
            copy_lines += [where] * len(copies)
        elif keyword == "ENV":
            for key, value in _env_pairs(rest).items():
                environment.env[key] = expand(value, {**build_args, **environment.env})
        elif keyword == "ARG":
            build_args.update(_arg_pair(rest, {**build_args, **environment.env}))
        elif keyword == "SHELL":
            shell = _exec_form(rest, where) or shell
        elif keyword == "RUN":
            environment.runs.append(_run(environment, rest, where, shell, build_args))
        elif keyword not in _IGNORED:
            raise _refuse(environment.image, where, f"a {keyword} step")
    environment.copies = [
        (source, _within_workdir(environment, target, where))
        for (source, target), where in zip(environment.copies, copy_lines, strict=True)
    ]
    return environment


def container_environment(dockerfile: Path, workdir: str | None) -> Environment:
    """What a container needs to know of a Dockerfile it builds: the last stage's image and
    working folder (``workdir``, ``task.toml``'s, first; else the last ``WORKDIR``; else
    ``/app``). Nothing is refused: the engine builds it."""
    environment = Environment(workdir=workdir or DEFAULT_WORKDIR)
    variables: dict[str, str] = {}
    folder = "/"
    for _, line in _instructions(dockerfile.read_text(encoding="utf-8", errors="replace")):
        word, _, rest = line.partition(" ")
        keyword, rest = word.upper(), rest.strip()
        if keyword == "FROM":
            environment.image, folder, variables = _from_image(rest), "/", {}
            environment.explicit_workdir = False
        elif keyword == "WORKDIR":
            folder = str(PurePosixPath(folder, expand(rest.strip("\"'"), variables)))
            environment.explicit_workdir = True
        elif keyword == "ENV":
            variables.update(_env_pairs(rest))
        elif keyword == "ARG":
            variables.update(_arg_pair(rest, variables))
    if workdir is None and environment.explicit_workdir:
        environment.workdir = posixpath.normpath(folder)
    return environment


def map_images(
    dockerfile: str, image_map: dict[str, str] | Callable[[str], str | None]
) -> tuple[str, dict[str, str]]:
    """``dockerfile`` with each image the map names replaced (in ``FROM`` lines and ``COPY
    --from=IMAGE``), and the replacements made (the task's image -> the stand-in).
    ``image_map``: a map (see :func:`mapped_image`), or a function giving an image's stand-in
    (``None``: none)."""
    lookup = image_map if callable(image_map) else functools.partial(mapped_image, image_map)
    used: dict[str, str] = {}
    stages = {m.group(1).lower() for m in _STAGE.finditer(dockerfile)}

    def swap(match: re.Match[str]) -> str:
        image = match.group(2)
        stand_in = None if image.lower() in stages else lookup(image)  # a stage is no image
        if stand_in is None:
            return match.group(0)
        used[image] = stand_in
        return f"{match.group(1)}{stand_in}{match.group(3)}"

    return _COPY_FROM.sub(swap, _FROM.sub(swap, dockerfile)), used


def mapped_image(image_map: dict[str, str], image: str) -> str | None:
    """``image``'s stand-in in ``image_map`` (``None``: it names none). Keys match as Docker
    names images (``ubuntu:24.04`` matches ``docker.io/library/ubuntu:24.04``); an exact key
    first, then patterns (``python:*``, as :func:`fnmatch.fnmatchcase`) in order."""
    name = normalize_image(image)
    exact = {normalize_image(k): v for k, v in image_map.items()}
    if name in exact:
        return exact[name]
    patterns = ((k, v) for k, v in image_map.items() if any(c in k for c in "*?["))
    return next((v for k, v in patterns if fnmatch.fnmatchcase(name, _pattern(k))), None)


def _pattern(key: str) -> str:
    """A pattern key as :func:`normalize_image` names images, with no tag added (``*``
    matches every image)."""
    return normalize_image(key) if ":" in key else normalize_image(key).removesuffix(":latest")


def check_image(image: str, where: str) -> None:
    """Accept ``image`` when it is the host's base system (see the module docstring).

    Raises:
        UnsupportedEnvironment: Any other image.
    """
    if normalize_image(image) not in host_images():
        raise UnsupportedEnvironment(
            f"{where}: the image {image!r} cannot be built here; envhub runs Harbor tasks in its "
            f"bubblewrap sandbox on the host's system, so the image must be one of "
            f"{', '.join(sorted(host_images())[:6])}, ... (or leave the environment out); "
            f"{CONTAINER_HINT}"
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


def normalize_image(image: str) -> str:
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
    target = PurePosixPath(environment.workdir, dest)  # checked against the final WORKDIR
    for source in sources:
        if "://" in source:
            raise _refuse(environment.image, where, f"a download ({source})")
    into_folder = (
        dest.endswith("/") or len(sources) > 1 or target == PurePosixPath(environment.workdir)
    )
    return [(s, str(target) + ("/" if into_folder else "")) for s in sources]


def _within_workdir(environment: Environment, target: str, where: str) -> str:
    """A copy's absolute target relative to the final working folder (the workspace's root)."""
    into_folder = target.endswith("/")
    try:
        relative = PurePosixPath(target).relative_to(environment.workdir)
    except ValueError:
        raise _refuse(
            environment.image,
            where,
            f"a copy to {target.rstrip('/')}, outside the working folder {environment.workdir}",
        ) from None
    return str(relative) + ("/" if into_folder else "")


def expand(value: str, variables: dict[str, str]) -> str:
    """``$NAME``, ``${NAME}`` and ``${NAME:-default}`` replaced as Docker does in ``ENV`` and
    ``WORKDIR`` (from ``variables``, else the sandbox's own environment, else empty)."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3)
        known = {**SANDBOX_ENV, **variables}
        if name in known:
            return known[name]
        return match.group(2) or ""

    return _VARIABLE.sub(one, value)


def _run(
    environment: Environment,
    rest: str,
    where: str,
    shell: tuple[str, ...],
    build_args: dict[str, str],
) -> RunInstruction:
    """A ``RUN`` step: its options dropped (a cache mount is fine; other mounts are not)."""
    while rest.startswith("--"):
        option, _, rest = rest.partition(" ")
        if option.startswith("--mount") and "type=cache" not in option:
            raise _refuse(environment.image, where, f"a RUN {option} (a build mount)")
        rest = rest.strip()
    if rest.startswith("<<"):
        raise _refuse(environment.image, where, "a RUN with a here-document")
    if not rest:
        raise EnvLoadError(f"{where}: a RUN without a command")
    argv = _exec_form(rest, where) or (*shell, rest)
    return RunInstruction(
        where=where,
        text=rest,
        argv=tuple(argv),
        workdir=environment.workdir if environment.explicit_workdir else None,
        env={**build_args, **environment.env},
        after_copies=len(environment.copies),
    )


def _exec_form(rest: str, where: str) -> tuple[str, ...] | None:
    """The words of a JSON array (``RUN ["a", "b"]``, ``SHELL [...]``), or ``None``."""
    if not rest.startswith("["):
        return None
    try:
        words = json.loads(rest)
    except ValueError as e:
        raise EnvLoadError(f"{where}: cannot read the JSON form {rest!r}: {e}") from None
    if not isinstance(words, list) or not words or not all(isinstance(w, str) for w in words):
        raise EnvLoadError(f"{where}: the JSON form must be a list of strings, got {rest!r}")
    return tuple(words)


def _arg_pair(rest: str, variables: dict[str, str]) -> dict[str, str]:
    """``ARG NAME=default`` as a variable of later ``RUN`` steps (``ARG NAME``: none)."""
    name, has_default, default = rest.strip().partition("=")
    if not has_default:
        return {}
    return {name.strip(): expand(default.strip().strip("\"'"), variables)}


def _env_pairs(rest: str) -> dict[str, str]:
    words = shlex.split(rest)
    if words and "=" not in words[0]:  # the old form: ENV KEY value with spaces
        return {words[0]: " ".join(words[1:])}
    return dict(w.split("=", 1) for w in words if "=" in w)


def _refuse(image: str | None, where: str, what: str) -> UnsupportedEnvironment:
    return UnsupportedEnvironment(
        f"{where}: the image {image or '(none)'!r} needs {what}, which needs a container build; "
        "envhub runs Harbor tasks on the host's base system in its bubblewrap sandbox "
        f"(see envhub.harbor.dockerfile for what runs); {CONTAINER_HINT}"
    )
