"""``envhub.train``: the Python entry point that mirrors ``envhub train``.

``envhub.train("run.yaml", ["steps=5"])`` is ``envhub train run.yaml steps=5``: the same config
(a YAML file, a dict or a :class:`~envhub.trainer.config.TrainConfig`), the same ``key=value``
overrides (a list of strings, or a mapping of dotted keys to values), the same checks before any
model loads, the same run folder; it returns the :class:`~envhub.trainer.loop.RunResult`.

``envs`` (and ``eval.envs``) take what Python has at hand besides names: an env class, an env
instance, or an env reference (``"path/to/file.py:Class"``). A class that a reference reaches
(defined at the top of a module or file) is stored as that reference, so the run's
``config.json`` finds it again on resume, from the CLI too; a class defined in a function, and
an instance, are registered in this process under the env's ``name`` (an instance is copied for
each episode, its settings kept).

Importing this module imports no ML library: the loop (torch) loads when a run starts.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envhub.errors import ConfigError
from envhub.trainer.config import (
    TrainConfig,
    apply_overrides,
    read_config_file,
    validate_config,
)

if TYPE_CHECKING:
    from envhub.trainer.loop import Reporter, RunResult

ConfigSource = str | Path | Mapping[str, Any] | TrainConfig | None
Overrides = Sequence[str] | Mapping[str, Any]


def train(
    config: ConfigSource = None,
    overrides: Overrides = (),
    *,
    reporter: Reporter | None = None,
    **fields: Any,
) -> RunResult:
    """Train as ``envhub train`` does, from Python; returns what the run left.

    Args:
        config: A YAML file, a config dict, a :class:`TrainConfig`, or ``None`` (every field
            from ``fields`` and ``overrides``).
        overrides: ``["optimizer.lr=1e-6", "steps=5"]`` (parsed as on the command line) or
            ``{"optimizer.lr": 1e-6}``; applied after ``fields``.
        reporter: Receives the run's progress (default: silent; the CLI's is
            ``envhub.cli.train_view.RichReporter``).
        **fields: Top-level config fields, replacing the config's: ``steps=5``,
            ``envs=[MyEnv]``, ``model={"name": "..."}``.

    Returns:
        The run's folder, its metrics per step (``final_metrics``: the last), its final model.

    Raises:
        ConfigError: The config is invalid (the message names the field).
        EnvNotFoundError: An env name or reference names no env (before any model loads).
        EnvLoadError: An env reference's code cannot be loaded.

    Example:
        >>> result = envhub.train("run.yaml", ["steps=5"], envs=["lookup_sum.py:LookupSum"])
        >>> result.run_dir, result.final_metrics["reward/mean"]
    """
    from envhub.trainer.env_names import check_env_names

    resolved = build_config(config, overrides, **fields)
    check_env_names(resolved)
    from envhub.trainer.loop import train as run  # torch loads here, not on import

    return run(resolved, reporter)


def build_config(
    config: ConfigSource = None, overrides: Overrides = (), **fields: Any
) -> TrainConfig:
    """The validated config :func:`train` runs (arguments as there); nothing runs."""
    data = _config_data(config)
    data.update(fields)
    apply_overrides(data, overrides)
    if "envs" in data:
        data["envs"] = _env_entries(data["envs"], "envs")
    if isinstance(data.get("eval"), Mapping) and "envs" in data["eval"]:
        data["eval"] = {**data["eval"], "envs": _env_entries(data["eval"]["envs"], "eval.envs")}
    return validate_config(data)


def _config_data(config: ConfigSource) -> dict[str, Any]:
    if config is None:
        return {}
    if isinstance(config, TrainConfig):
        return config.model_dump()
    if isinstance(config, (str, Path)):
        return read_config_file(config)
    if isinstance(config, Mapping):
        return copy.deepcopy(dict(config))
    raise ConfigError(
        f"config must be a YAML file's path, a dict or a TrainConfig, got {type(config).__name__}"
    )


def _env_entries(entries: Any, field: str) -> Any:
    """``envs`` with each env class or instance replaced by a name ``envhub.make`` takes."""
    if not isinstance(entries, (list, tuple)):
        entries = [entries]
    return [_env_entry(entry, f"{field}.{i}") for i, entry in enumerate(entries)]


def _env_entry(entry: Any, field: str) -> Any:
    if isinstance(entry, Mapping):
        return (
            {**entry, "name": _env_name(entry.get("name"), f"{field}.name")}
            if "name" in entry
            else dict(entry)
        )
    return {"name": _env_name(entry, f"{field}.name")}


def _env_name(env: Any, field: str) -> Any:
    """A name for ``env``: a string as it is, an Env class's reference (or its registered
    name), an Env instance's registered name."""
    import inspect

    from envhub.env import Env
    from envhub.references import reference_for

    if inspect.isclass(env) and issubclass(env, Env):
        return reference_for(env) or _register(env.name, env, field)
    if isinstance(env, Env):
        return _register(env.name, _copies_of(env), field)
    return env


def _copies_of(env: Any) -> Any:
    def make() -> Any:
        return copy.deepcopy(env)

    make.__qualname__ = f"copy_of[{type(env).__name__}]"
    return make


def _register(name: str, target: Any, field: str) -> str:
    """Register ``target`` in this process as ``name``, unless an installed env has it."""
    from envhub import registry

    known = registry.list_envs().get(name)
    if known is not None and known.distribution is not None:
        raise ConfigError(
            f"{field}: your env is named {name!r}, as the installed env from "
            f"{known.distribution}; give its class another `name`"
        )
    registry.register(name, target, override=True)
    return name
