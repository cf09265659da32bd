"""Env packages on disk: a folder with a pyproject.toml that declares ``envhub.envs`` entry points.

Used by ``envhub check PATH`` to load a package's envs without installing it.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Any

from envhub.errors import EnvLoadError
from envhub.registry import ENTRY_POINT_GROUP, EnvSpec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def read_pyproject(path: Path) -> dict:
    """The parsed pyproject.toml of the package at ``path``."""
    file = path / "pyproject.toml"
    if not file.is_file():
        raise EnvLoadError(
            f"{path} is not an env package: it has no pyproject.toml. "
            f"{_file_env_hint(path)}or create a package with `envhub init`"
        )
    try:
        return tomllib.loads(file.read_text())
    except tomllib.TOMLDecodeError as e:
        raise EnvLoadError(f"{file} is not valid TOML: {e}") from e


def package_env_specs(path: str | Path) -> dict[str, EnvSpec]:
    """The envs a package declares, loadable from its folder (which is put on ``sys.path``).

    Raises:
        EnvLoadError: No pyproject, invalid TOML, or no ``envhub.envs`` entry points.
    """
    root = Path(path).resolve()
    project = read_pyproject(root).get("project", {})
    entry_points = project.get("entry-points", {}).get(ENTRY_POINT_GROUP, {})
    if not entry_points:
        raise EnvLoadError(
            f"{root}/pyproject.toml declares no envs; add them under "
            f'[project.entry-points."{ENTRY_POINT_GROUP}"] as name = "module:EnvClass"'
        )
    for candidate in (root / "src", root):
        if candidate.is_dir() and str(candidate) not in sys.path:
            sys.path.insert(0, str(candidate))
    dist, version = project.get("name"), project.get("version")
    return {name: EnvSpec(name, target, dist, version) for name, target in entry_points.items()}


def _file_env_hint(path: Path) -> str:
    """"Name an env file: ..." with the env classes the folder's files seem to define (read,
    not imported: a folder's scripts must not run just because it was named)."""
    found = []
    for file in sorted(path.glob("*.py")):
        try:
            tree = ast.parse(file.read_text(errors="replace"))
        except (SyntaxError, ValueError):
            continue
        found += [
            f"{file}:{node.name}"
            for node in tree.body
            if isinstance(node, ast.ClassDef) and any(_looks_like_env(b) for b in node.bases)
        ]
    if not found:
        return "Name an env file instead (path/to/file.py:Class), "
    return f"Name an env file instead ({', '.join(found[:5])}), "


def _looks_like_env(base: ast.expr) -> bool:
    name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
    return name.endswith("Env")


def env_kind(target: Any) -> str:
    """What kind of env ``target`` (an env class, or an env) is: ``tool``, ``multi-turn``,
    ``single-turn``, ``multi-role``, ``custom``, or ``factory`` (a function that makes one)."""
    import inspect

    from envhub.env import Env, SingleTurnEnv
    from envhub.multiturn import MultiTurnEnv, ToolEnv
    from envhub.roles import MultiRoleEnv

    cls = target if inspect.isclass(target) else type(target)
    kinds = [
        (ToolEnv, "tool"),
        (MultiTurnEnv, "multi-turn"),
        (SingleTurnEnv, "single-turn"),
        (MultiRoleEnv, "multi-role"),
        (Env, "custom"),
    ]
    return next((label for base, label in kinds if issubclass(cls, base)), "factory")


def tool_names(target: Any) -> list[str]:
    """The names of the tools ``target`` (an env class, or an env) offers."""
    return [getattr(t, "name", str(t)) for t in getattr(target, "tools", None) or ()]
