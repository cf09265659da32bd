"""Register envhub's envs with gymnasium whenever gymnasium gets imported.

gymnasium 1.x no longer loads plugins through entry points, and importing gymnasium eagerly
from ``import envhub`` would cost ~150 ms (numpy). Instead, a one-shot finder on
``sys.meta_path`` waits for ``import gymnasium`` and registers ``envhub/<name>`` ids right after
gymnasium's own module has run, so ``gymnasium.make("envhub/<name>")`` works whichever of the
two packages is imported first.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType


def _register(_module: ModuleType | None = None) -> None:
    from envhub.registry import register_gymnasium_envs

    register_gymnasium_envs()


class _Loader(importlib.abc.Loader):
    """Runs gymnasium's own loader, then registers envhub's envs."""

    def __init__(self, wrapped: importlib.abc.Loader) -> None:
        self.wrapped = wrapped

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.wrapped.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.wrapped.exec_module(module)
        _register()


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, name: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != "gymnasium":
            return None
        sys.meta_path.remove(self)  # one shot; also lets the real finders answer below
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    """Register now if gymnasium is loaded, else as soon as it is."""
    if "gymnasium" in sys.modules:
        _register()
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
