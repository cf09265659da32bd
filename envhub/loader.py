"""``envhub.make``: an env by local name or by Hub reference.

A name that is registered or installed is made by :func:`envhub.registry.make`. Any other name
with a ``/`` in it is a Hub reference, ``owner/name[@version|@commit][:env]``, and goes to
:func:`envhub.hub.load.make_from_hub`. The imports run one way: this module sits above both,
``envhub.hub`` imports the registry, and the registry knows nothing of the Hub. The Hub code is
imported only when a Hub env is asked for, so ``import envhub`` and local envs never load the
Hub client.

A folder of Harbor tasks (a task folder, or a folder of them), or a Harbor registry file
(``registry.json[:NAME@VERSION]``), gives a :class:`~envhub.harbor.env.HarborEnv` (imported
only then).

An env reference, ``path/to/file.py:Class``, ``path/to/file.py`` or ``module:Class``, gives
that class (see :mod:`envhub.references`).

A ``ws://``, ``wss://``, ``http://`` or ``https://`` URL names an env served by ``envhub serve``
and gives a :class:`~envhub.serve.remote.RemoteEnv` (imported only then).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envhub import registry
from envhub.adapters import adapted_spec, make_adapted, split_adapted
from envhub.errors import EnvNotFoundError
from envhub.references import load_reference, parse_reference
from envhub.registry import EnvSpec

REMOTE_SCHEMES = ("ws://", "wss://", "http://", "https://")


def is_remote_url(name: str) -> bool:
    """Whether ``name`` is the URL of an env served by ``envhub serve``."""
    return name.startswith(REMOTE_SCHEMES)


def is_task_path(name: str) -> bool:
    """Whether ``name`` is a folder of Harbor tasks and no env's name: a folder with a
    ``task.toml`` or ``instruction.md``, or one whose subfolders have them; or a Harbor
    registry file (``registry.json``, ``registry.json:NAME@VERSION``)."""
    path = Path(name)
    if _is_registry_file(name):
        return name not in registry.list_envs()
    if not path.is_dir() or name in registry.list_envs():
        return False
    return _has_task_file(path) or any(_has_task_file(p) for p in path.iterdir() if p.is_dir())


def _is_registry_file(name: str) -> bool:
    if ".json" not in name:  # Harbor's reader loads only for a registry file
        return False
    from envhub.harbor.registry import split_reference

    return split_reference(name) is not None


def _has_task_file(path: Path) -> bool:
    return any((path / name).is_file() for name in ("task.toml", "instruction.md", "task.yaml"))


def is_hub_reference(name: str) -> bool:
    """Whether ``name`` goes to the Hub: it has a ``/`` and no local env has that name.

    Args:
        name: An env name or a Hub reference.

    Returns:
        True for a Hub reference, False for a name the registry answers for.
    """
    return (
        "/" in name
        and not is_remote_url(name)
        and not is_task_path(name)
        and split_adapted(name) is None
        and name not in registry.list_envs()
        and parse_reference(name) is None
    )


def reference_spec(name: str) -> EnvSpec | None:
    """The spec of the class an env reference (``file.py:Class``, ``module:Class``) names, its
    code imported; ``None`` when ``name`` is a registered name or no reference.

    Raises:
        EnvNotFoundError: No such file, module or class.
        EnvLoadError: The code raised on import, or the class is no ``Env`` subclass.
    """
    if name in registry.list_envs() or parse_reference(name) is None:
        return None
    return EnvSpec(name, load_reference(name))


def make(name: str, **kwargs: Any) -> Any:
    """Construct the env ``name`` with ``kwargs``, from the local registry or from the Hub.

    ``name`` may be the URL of a served env (``ws://host:port/ENV?arg=value``, or ``http://``;
    see :class:`~envhub.serve.remote.RemoteEnv`, which takes ``token``, ``timeout`` and
    ``retries``), or a Hub reference, ``owner/name[@version|@commit]``: the package is resolved to
    a commit (through ``envhub.lock`` when it pins the repo) and made from its installation;
    installing it first needs ``trust_remote_code=True`` (see ``envhub.hub.load``).

    ``name`` may also name an env's code: ``path/to/file.py:Class``, ``path/to/file.py`` (the
    one Env subclass it defines) or ``module:Class`` (see :mod:`envhub.references`).

    Args:
        name: A registered or installed env's name, a Hub reference, an env reference.
        **kwargs: Arguments for the env's constructor (and, for a Hub reference,
            ``trust_remote_code``, ``allow_changes`` and ``token``).

    Returns:
        The new env.

    Raises:
        EnvNotFoundError: No such env (the message suggests close names), or no such Hub package
            or version (a ``HubNotFoundError``).
        EnvLoadError: The env's package is broken or rejects the arguments.
        ConfigError: A malformed Hub reference, or one not installed yet and no
            ``trust_remote_code``.
    """
    if is_remote_url(name):
        from envhub.serve.remote import RemoteEnv  # the client loads only for remote envs

        return RemoteEnv(name, **kwargs)
    if split_adapted(name) is not None:  # `verifiers:NAME`: another framework's env
        return make_adapted(name, **kwargs)
    spec = reference_spec(name)
    if spec is not None:
        return registry.make_from_spec(spec, **kwargs)
    if is_task_path(name):
        if "agent" in kwargs:  # played by an agent program rather than by the policy's calls
            from envhub.harbor.agent_env import HarborAgentEnv

            return HarborAgentEnv(name, **kwargs)
        from envhub.harbor.env import HarborEnv  # Harbor's reader loads only for task folders

        return HarborEnv(name, **kwargs)
    if is_hub_reference(name):
        from envhub.hub.load import make_from_hub  # the Hub client loads only for Hub envs

        return make_from_hub(name, **kwargs)
    return registry.make(name, **kwargs)


def resolve(name: str) -> EnvSpec | None:
    """Find what ``name`` names without constructing an env (an env reference's code is
    imported): its spec, or ``None`` for the names only making the env can check (a served
    env's URL, a Hub reference, a folder of Harbor tasks).

    Raises:
        EnvNotFoundError: No env of that name (with the close ones), no such file or class.
        EnvLoadError: An env reference's code raised, or names no ``Env`` subclass.
    """
    if is_remote_url(name) or is_task_path(name) or is_hub_reference(name):
        return None
    return get_spec(name)


def get_spec(name: str) -> EnvSpec:
    """:func:`envhub.registry.get_spec`, except that a Hub reference gets told to install its
    package first (``envhub check owner/name`` lands here) instead of "did you mean", an
    adapted name (``verifiers:NAME``) gets a spec that makes it through its adapter, and an env
    reference (``file.py:Class``) a spec of its class, imported.
    """
    if split_adapted(name) is not None:
        return adapted_spec(name)
    spec = reference_spec(name)
    if spec is not None:
        return spec
    if not is_hub_reference(name):
        return registry.get_spec(name)
    installed = ", ".join(sorted(registry.list_envs())) or "none"
    raise EnvNotFoundError(
        f"{name!r} looks like a Hub reference (owner/name[@version]); no installed env has that "
        f"name. Install the package first, then use its env name. Installed: {installed}"
    )
