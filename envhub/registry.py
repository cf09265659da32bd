"""Finding and constructing envs by name.

Envs are found through the ``envhub.envs`` entry-point group (built-in envs are declared there
too, in envhub's own pyproject), plus anything registered in-process with :func:`register`.
Every env is also registered with gymnasium as ``envhub/<name>`` as soon as both envhub and
gymnasium are imported, in either order (see ``envhub._gymnasium_hook``).

This module knows only local envs (registered or installed). The public ``envhub.make`` lives
above it, in ``envhub.loader``, which imports this module and never the other way round.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from envhub.errors import EnvLoadError, EnvNotFoundError

ENTRY_POINT_GROUP = "envhub.envs"
GYM_NAMESPACE = "envhub"


@dataclass(frozen=True)
class EnvSpec:
    """Where an env comes from."""

    name: str
    target: str | Callable[..., Any]
    """``"module:attr"`` or the callable itself."""
    distribution: str | None = None
    version: str | None = None

    @property
    def target_path(self) -> str:
        """The target as ``"module:attr"``, also when it is a callable."""
        if isinstance(self.target, str):
            return self.target
        return f"{self.target.__module__}:{self.target.__qualname__}"

    def load(self) -> Callable[..., Any]:
        """Import the env class or factory."""
        if not isinstance(self.target, str):
            return self.target
        module_name, _, attr = self.target.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
            for part in attr.split(".") if attr else []:
                obj = getattr(obj, part)
        except Exception as e:
            origin = f" (from {self.distribution} {self.version})" if self.distribution else ""
            raise EnvLoadError(
                f"cannot load env {self.name!r} from {self.target}{origin}: {type(e).__name__}: {e}"
            ) from e
        return obj


_registered: dict[str, EnvSpec] = {}


def register(name: str, target: str | Callable[..., Any], *, override: bool = False) -> None:
    """Register an env in this process (tests, notebooks); packages use entry points instead.

    Args:
        name: Name for :func:`make`.
        target: An ``Env`` subclass, a factory returning one, or a ``"module:attr"`` path.
        override: Replace an env of the same name instead of raising.
    """
    if not override and name in list_envs():
        raise EnvLoadError(
            f"an env named {name!r} is already registered; pass override=True to replace it"
        )
    _registered[name] = EnvSpec(name, target)
    _gym_register(name, _registered[name])


@functools.lru_cache(maxsize=1)
def _entry_point_specs() -> dict[str, EnvSpec]:
    specs: dict[str, EnvSpec] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        specs[ep.name] = EnvSpec(
            ep.name, ep.value, dist.name if dist else None, dist.version if dist else None
        )
    return specs


def refresh() -> None:
    """Forget cached entry points (after installing an env package in this process)."""
    _entry_point_specs.cache_clear()
    importlib.invalidate_caches()


def list_envs() -> dict[str, EnvSpec]:
    """Every known env by name (in-process registrations win over entry points)."""
    return {**_entry_point_specs(), **_registered}


def get_spec(name: str) -> EnvSpec:
    """The spec of the env ``name``.

    Args:
        name: A registered or installed env's name.

    Returns:
        Where the env comes from.

    Raises:
        EnvNotFoundError: No such env (the message suggests close names).
    """
    envs = list_envs()
    if name in envs:
        return envs[name]
    close = difflib.get_close_matches(name, list(envs), n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise EnvNotFoundError(
        f"no env named {name!r}.{hint} Run `envhub list` to see all {len(envs)} envs."
    )


def make(name: str, **kwargs: Any) -> Any:
    """Construct the env registered or installed as ``name`` with ``kwargs``.

    Local envs only: ``envhub.make`` (in ``envhub.loader``) also takes other kinds of name and
    calls this for local ones.

    Args:
        name: A registered or installed env's name.
        **kwargs: Arguments for the env's constructor.

    Returns:
        The new env.

    Raises:
        EnvNotFoundError: No such env (the message suggests close names).
        EnvLoadError: The env's package is broken or rejects the arguments.
    """
    return make_from_spec(get_spec(name), **kwargs)


def make_from_spec(spec: EnvSpec, **kwargs: Any) -> Any:
    """Construct the env ``spec`` describes with ``kwargs`` (:func:`make` once it found it).

    Raises:
        EnvLoadError: The env's code is broken or rejects the arguments.
    """
    name = spec.name
    factory = spec.load()
    _check_kwargs(name, factory, kwargs)
    try:
        return factory(**kwargs)
    except Exception as e:
        hint = ""
        if isinstance(e, TypeError) and "unexpected keyword argument" in str(e):
            hint = f"; it accepts: {', '.join(_accepted_kwargs(factory)) or 'nothing'}"
        raise EnvLoadError(
            f"env {name!r} failed to construct: {type(e).__name__}: {e}{hint}"
        ) from e


def _accepted_kwargs(factory: Callable[..., Any]) -> list[str]:
    """Keyword arguments of ``factory``, following ``**kwargs`` up a class's ``__init__`` chain."""
    is_class = inspect.isclass(factory)
    inits = (
        [vars(c)["__init__"] for c in factory.__mro__ if "__init__" in vars(c)]
        if is_class
        else [factory]
    )
    accepted: list[str] = []
    for init in inits:
        try:
            params = list(inspect.signature(init).parameters.values())[
                1 if is_class else 0 :
            ]  # drop self
        except (TypeError, ValueError):
            break
        accepted += [
            p.name
            for p in params
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in accepted
        ]
        if not any(p.kind == p.VAR_KEYWORD for p in params):
            break
    return accepted


def _check_kwargs(name: str, factory: Callable[..., Any], kwargs: dict[str, Any]) -> None:
    """Reject unknown arguments up front, with the list of accepted ones. A factory that takes
    **kwargs forwards them to its bases, and its constructor judges them instead."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return
    accepted = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = [k for k in kwargs if k not in accepted]
    if unknown:
        raise EnvLoadError(
            f"env {name!r} does not accept {', '.join(map(repr, unknown))}; "
            f"it accepts: {', '.join(accepted) or 'nothing'}"
        )


def register_gymnasium_envs() -> None:
    """Register every envhub env with gymnasium as ``envhub/<name>``."""
    for name, spec in list_envs().items():
        _gym_register(name, spec)


def _gym_register(name: str, spec: EnvSpec) -> None:
    """Register ``envhub/<name>``; a name gymnasium cannot parse as an id (``a b``, ``a/b``) is
    left out of gymnasium, since one odd env name must not break ``import envhub``."""
    import gymnasium

    env_id = f"{GYM_NAMESPACE}/{name}"
    if env_id in gymnasium.registry:
        del gymnasium.registry[env_id]
    target = spec.target if isinstance(spec.target, str) else spec.load()
    try:
        gymnasium.register(
            id=env_id, entry_point=target, disable_env_checker=True, order_enforce=False
        )
    except gymnasium.error.Error:
        gymnasium.registry.pop(env_id, None)
