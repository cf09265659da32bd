"""Other frameworks' environments as envhub envs, by name: ``<framework>:<name>``.

``envhub.make("verifiers:wordle")`` asks the ``verifiers`` adapter for its env ``wordle``; each
adapter lives in its own module here, imports its framework only when used (the frameworks are
optional extras) and exposes two functions:

- ``make_env(name: str, **kwargs) -> envhub.Env``: the adapted env, or
  :class:`~envhub.errors.EnvNotFoundError` / :class:`~envhub.errors.EnvLoadError` saying what to
  install or fix;
- ``list_envs() -> dict[str, str]``: the names it can make here (without the prefix) and a
  one-line description of each, ``{}`` when its framework is not installed.

``envhub list``, ``eval``, ``check`` and ``train`` take adapted names like any other.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from envhub.errors import EnvNotFoundError
from envhub.registry import EnvSpec

ADAPTERS: dict[str, str] = {
    "verifiers": "envhub.adapters.verifiers",
    "openenv": "envhub.adapters.openenv",
    "gem": "envhub.adapters.gem",
}
"""Prefix -> the module that adapts that framework's envs."""

FRAMEWORK_IMPORTS: dict[str, str] = {"verifiers": "verifiers", "openenv": "openenv", "gem": "gem"}
"""Prefix -> the framework's import name: installed or not is known without importing it."""

FRAMEWORK_TITLES: dict[str, str] = {
    "verifiers": "verifiers environments; envhub list --framework verifiers",
    "openenv": "an OpenEnv server, by its URL: openenv:http://HOST:PORT",
    "gem": "GEM's text envs (gem-llm); envhub list --framework gem",
}
"""Prefix -> what its names stand for, for ``envhub list``."""


def installed_frameworks() -> list[str]:
    """The adapter prefixes whose framework is installed here (nothing is imported)."""
    return [
        prefix
        for prefix, module in FRAMEWORK_IMPORTS.items()
        if importlib.util.find_spec(module) is not None
    ]


def split_adapted(name: str) -> tuple[str, str] | None:
    """``(framework, env name)`` when ``name`` is ``<framework>:<name>`` for a known adapter,
    else ``None`` (a Hub reference's ``owner/name:env`` never matches: its prefix has a ``/``)."""
    prefix, sep, rest = name.partition(":")
    if not sep or prefix not in ADAPTERS:
        return None
    return prefix, rest


def _adapter(framework: str) -> Any:
    try:
        return importlib.import_module(ADAPTERS[framework])
    except ModuleNotFoundError as e:
        if e.name != ADAPTERS[framework]:
            raise
        raise EnvNotFoundError(
            f"no adapter for {framework!r} envs in this envhub version"
        ) from None


def make_adapted(name: str, **kwargs: Any) -> Any:
    """Make the adapted env ``<framework>:<name>`` (see the module docstring)."""
    found = split_adapted(name)
    if found is None:
        raise EnvNotFoundError(f"{name!r} is not an adapted env name; known: {list(ADAPTERS)}")
    framework, env_name = found
    if not env_name:
        raise EnvNotFoundError(f"{name!r} names no env: write {framework}:<env name>")
    return _adapter(framework).make_env(env_name, **kwargs)


def adapted_spec(name: str) -> EnvSpec:
    """An :class:`~envhub.registry.EnvSpec` for ``<framework>:<name>`` whose target makes the
    env through its adapter, for what takes a spec (``envhub check``); ``distribution`` is the
    framework. Nothing is imported until the target is called."""
    found = split_adapted(name)
    if found is None:
        raise EnvNotFoundError(f"{name!r} is not an adapted env name; known: {list(ADAPTERS)}")

    def make(**kwargs: Any) -> Any:
        return make_adapted(name, **kwargs)

    make.__qualname__ = f"make_adapted[{name}]"
    return EnvSpec(name, make, distribution=found[0])


def list_adapted(only: str | None = None) -> dict[str, str]:
    """Every adapted env this Python environment can make, ``{"verifiers:NAME": description}``,
    or only framework ``only``'s (the others are then not imported); an adapter whose
    framework is missing lists nothing."""
    found: dict[str, str] = {}
    for framework in [only] if only is not None else ADAPTERS:
        try:
            listed = _adapter(framework).list_envs()
        except EnvNotFoundError:
            continue
        found |= {f"{framework}:{name}": text for name, text in listed.items()}
    return found
