"""Scaffolding: ``envhub init`` renders a template into a new, working env package.

A template is a folder ``templates/<template>/`` shipped inside envhub as the package data of
``envhub.templates``. Rendering copies it file by file:

- a file ending in ``.tmpl`` has ``{{name}}``, ``{{module}}``, ``{{class_name}}`` and
  ``{{envhub_version}}`` replaced and loses the suffix (``env.py.tmpl`` -> ``env.py``);
- a folder named ``__module__`` takes the package's module name;
- every other file is copied byte for byte.

Nothing is written at the destination until the whole package has rendered: it is built in a
temporary folder beside the destination, then renamed into place, so a failure never leaves a
half-written package behind.
"""

from __future__ import annotations

import difflib
import functools
import keyword
import os
import re
import shutil
import sys
import uuid
from collections.abc import Iterator
from importlib import metadata, resources
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from envhub.errors import ConfigError

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

TEMPLATES = ("single-turn", "multi-turn", "tool", "code", "agent")
"""The templates: one prompt and one exact-match answer (capital cities); a game with feedback
every turn (a hidden number, higher/lower hints); a tool that reads hidden per-episode state
(a warehouse inventory); code scored by test cases run in a sandbox; an agent program of your
own (an ``openai``-SDK tool loop) trained as it is (a harness env)."""

_NAME = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
_RESERVED = {"envhub": "envhub itself", "tests": "the package's own tests folder"}
_TEMPLATE_SUFFIX = ".tmpl"
_MODULE_DIR = "__module__"
_SKIPPED = {"__pycache__", ".DS_Store"}


def module_name(name: str) -> str:
    """The import name of package ``name``: ``my-env`` -> ``my_env``."""
    return name.replace("-", "_")


def class_name(name: str) -> str:
    """The env class of package ``name``: ``capital-cities`` -> ``CapitalCitiesEnv``
    (``my-env`` -> ``MyEnv``, not ``MyEnvEnv``)."""
    camel = "".join(part[:1].upper() + part[1:] for part in name.split("-"))
    return camel if camel.endswith("Env") else f"{camel}Env"


def suggest_name(name: str) -> str:
    """A valid package name close to ``name``.

    E.g. ``My_Env`` -> ``my-env``, ``2048`` -> ``env-2048``.
    """
    text = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", name).lower()
    text = re.sub(r"[^a-z0-9]+", "-", text).strip("-")
    if not text:
        return "my-env"
    text = text if text[0].isalpha() else f"env-{text}"
    return f"{text}-env" if _module_clash(module_name(text)) else text


def validate_name(name: str) -> None:
    """Raise :class:`ConfigError` unless ``name`` can name an env package and its module.

    A name is lowercase letters, digits and single hyphens, starting with a letter, and its
    module name must not hide another module (the standard library, envhub, an installed
    package).
    """
    if not _NAME.match(name):
        raise ConfigError(
            f"invalid env name {name!r}: use lowercase letters, digits and hyphens, "
            f"starting with a letter; try {suggest_name(name)!r}"
        )
    module = module_name(name)
    clash = _module_clash(module)
    if clash:
        raise ConfigError(
            f"invalid env name {name!r}: its module {module!r} would clash with {clash}; "
            f"try {name + '-env'!r}"
        )


def _module_clash(module: str) -> str | None:
    """What importing ``module`` from the package folder would hide, if anything."""
    if module in _RESERVED:
        return _RESERVED[module]
    if keyword.iskeyword(module):
        return "a Python keyword"
    if module in sys.stdlib_module_names:
        return "the standard library"
    owners = _installed_modules().get(module)
    return f"the installed package {owners[0]!r}" if owners else None


@functools.lru_cache(maxsize=1)
def _installed_modules() -> dict[str, list[str]]:
    """Top-level module -> installed distributions providing it (read once per process)."""
    return metadata.packages_distributions()


def template_values(name: str) -> dict[str, str]:
    """What each ``{{placeholder}}`` of a template becomes for package ``name``."""
    from envhub.version import __version__

    return {
        "name": name,
        "module": module_name(name),
        "class_name": class_name(name),
        "envhub_version": __version__,
    }


def render_text(text: str, values: dict[str, str]) -> str:
    """Replace each ``{{key}}`` of ``values`` in ``text`` (other braces are left alone)."""
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", value)
    return text


def template_root(template: str) -> Traversable:
    """The folder of ``template`` inside the installed envhub.

    Raises:
        ConfigError: No template by that name (the message suggests the nearest one).
    """
    if template not in TEMPLATES:
        close = difflib.get_close_matches(template, TEMPLATES, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"unknown template {template!r}.{hint} Templates: {', '.join(TEMPLATES)}")
    root = resources.files("envhub.templates") / template
    if not root.is_dir():
        raise ConfigError(
            f"template {template!r} is missing from this envhub install; reinstall envhub"
        )
    return root


def template_files(name: str, template: str = "single-turn") -> list[str]:
    """The files :func:`create_package` writes for ``name`` and ``template``: sorted paths
    relative to the package folder, with ``/`` separators."""
    return sorted(str(path) for _, path in _plan(template_root(template), template_values(name)))


def create_package(
    name: str,
    template: str = "single-turn",
    directory: str | Path | None = None,
    *,
    force: bool = False,
) -> Path:
    """Write a new env package ``directory/name`` from ``template``.

    Args:
        name: Package and env name: lowercase letters, digits and hyphens, starting with a letter.
        template: One of :data:`TEMPLATES`.
        directory: Folder to create the package in (default: the current folder).
        force: Write into an existing, non-empty folder, replacing the files the template
            writes and leaving every other file as it is.

    Returns:
        The package folder.

    Raises:
        ConfigError: Invalid name, unknown template, or a destination that cannot be used.
    """
    validate_name(name)
    source = template_root(template)
    destination = Path(directory if directory is not None else ".").absolute() / name
    _check_destination(destination, force)
    staging = destination.parent / f".{name}-{uuid.uuid4().hex[:8]}.tmp"
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
        staging.mkdir()
    except OSError as e:
        raise ConfigError(
            f"cannot create a package in {destination.parent}: {e.strerror or e}"
        ) from e
    try:
        _render_tree(source, staging, template_values(name))
        _move_into_place(staging, destination)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return destination


def _check_destination(destination: Path, force: bool) -> None:
    if destination.parent.exists() and not destination.parent.is_dir():
        raise ConfigError(f"{destination.parent} is not a folder")
    if not destination.exists():
        return
    if not destination.is_dir():
        raise ConfigError(f"{destination} exists and is not a folder")
    if any(destination.iterdir()) and not force:
        raise ConfigError(
            f"{destination} already exists and is not empty; choose another name or folder, "
            "or use --force (force=True) to write into it"
        )


def _plan(
    source: Traversable, values: dict[str, str], prefix: PurePosixPath = PurePosixPath()
) -> Iterator[tuple[Traversable, PurePosixPath]]:
    """Each file of a template with the path it is written to, in name order."""
    for entry in sorted(source.iterdir(), key=lambda e: e.name):
        if entry.name in _SKIPPED or entry.name.endswith(".pyc"):
            continue
        if entry.is_dir():
            folder = values["module"] if entry.name == _MODULE_DIR else entry.name
            yield from _plan(entry, values, prefix / folder)
        else:
            yield entry, prefix / entry.name.removesuffix(_TEMPLATE_SUFFIX)


def _render_tree(source: Traversable, target: Path, values: dict[str, str]) -> None:
    for entry, relative in _plan(source, values):
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if entry.name.endswith(_TEMPLATE_SUFFIX):
            with open(path, "w", encoding="utf-8", newline="") as f:
                f.write(render_text(entry.read_text(encoding="utf-8"), values))
        else:
            path.write_bytes(entry.read_bytes())


def _move_into_place(staging: Path, destination: Path) -> None:
    """Rename the rendered folder to ``destination``, or move its files into an existing one."""
    if destination.is_dir() and not any(destination.iterdir()):
        destination.rmdir()
    if not destination.exists():
        staging.rename(destination)
        return
    files = sorted(p.relative_to(staging) for p in staging.rglob("*") if p.is_file())
    blocked = [str(f) for f in files if _in_the_way(destination, f)]
    if blocked:
        raise ConfigError(
            f"cannot write {', '.join(blocked)} into {destination}: "
            "something of that name is in the way"
        )
    for file in files:
        (destination / file).parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / file, destination / file)


def _in_the_way(destination: Path, file: Path) -> bool:
    """True when ``file`` cannot be written: a folder has its name, or a file has the name of
    one of its folders."""
    if (destination / file).is_dir():
        return True
    return any(
        (destination / p).exists() and not (destination / p).is_dir()
        for p in file.parents
        if p != Path(".")
    )
