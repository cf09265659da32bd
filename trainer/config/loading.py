"""Reading a config: the YAML file, ``load_config``'s order (read, override, follow the envs,
validate), and pydantic's errors and unknown keys turned into one readable ``ConfigError``."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from envhub.errors import ConfigError
from envhub.trainer.config.overrides import (
    apply_overrides,
    env_names,
    follow_overridden_envs,
    parse_override,
)
from envhub.trainer.config.run import TrainConfig


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    notes: list[str] | None = None,
) -> TrainConfig:
    """Read a YAML config, apply ``key=value`` overrides, validate.

    When the overrides change the names of the envs trained on (``envs.0.name=my_env.py``),
    the file's ``logging.run_name`` and its ``eval`` section, which were written for its own
    envs, are dropped unless overridden too (see :func:`follow_overridden_envs`); what was
    dropped is added to ``notes``.

    Raises:
        ConfigError: the file is missing or not YAML, an override is malformed, a key is unknown
            (wherever it was written), or a value is invalid; the message names the field and
            what is allowed.
    """
    data = read_config_file(path) if path is not None else {}
    file_envs = env_names(data)
    apply_overrides(data, overrides)
    dropped = follow_overridden_envs(data, file_envs, [parse_override(o)[0] for o in overrides])
    if notes is not None:
        notes += dropped
    return validate_config(data)


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The YAML config at ``path`` as a dict, not validated yet.

    Raises:
        ConfigError: The file is missing (the message names the shipped examples), not YAML, or
            not a mapping.
    """
    return _read_yaml(Path(path))


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    if not path.is_file():
        raise ConfigError(_missing_file_message(path))
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path} must hold a mapping of config sections, got {type(data).__name__}"
        )
    return data


def _missing_file_message(path: Path) -> str:
    """Point at the configs shipped in the package (a pip install has no ``examples/`` folder),
    suggesting the one whose name resembles the missing file's."""
    from envhub import examples

    close = difflib.get_close_matches(path.stem, examples.names(), n=1)
    if close:
        return (
            f"config file not found: {path} (did you mean the shipped example {close[0]!r}? "
            f"train on it with `envhub train --example {close[0]}`; "
            "`envhub examples` lists them all)"
        )
    return (
        f"config file not found: {path}; `envhub examples` lists the shipped configs "
        "(train on one with `envhub train --example NAME`, or copy one with "
        "`envhub examples NAME --copy DIR`)"
    )


def validate_config(data: dict[str, Any]) -> TrainConfig:
    """Validate a config dict, turning pydantic's errors into one readable ``ConfigError``.

    Unknown keys are reported first, each with the nearest valid name (see :func:`unknown_keys`).
    """
    unknown = unknown_keys(data)
    if unknown:
        raise ConfigError("\n".join(unknown))
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(
            "invalid training config:\n" + "\n".join(_describe(err) for err in e.errors())
        ) from None


def unknown_keys(
    data: Any, model: type[BaseModel] = TrainConfig, path: tuple[str, ...] = ()
) -> list[str]:
    """One message per key of ``data`` that ``model`` lacks, at any depth (list items included).

    The one place unknown keys are named, so a typo reads the same in a YAML file, an override
    or a dict: ``unknown config key 'rollout.task_per_step' (did you mean 'tasks_per_step'?)``.
    Free-form values (an env's ``args``) are not looked into: the env checks its own arguments
    when it is made, and names the ones it accepts.
    """
    if not isinstance(data, dict):
        return []
    fields = model.model_fields
    messages = []
    for key, value in data.items():
        where = (*path, str(key))
        if key not in fields:
            messages.append(_unknown_key_message(where, list(fields)))
            continue
        submodel = _submodel(fields[key].annotation)
        if submodel is None:
            continue
        items = enumerate(value) if isinstance(value, list) else [(None, value)]
        for index, item in items:
            inner = where if index is None else (*where, str(index))
            messages += unknown_keys(item, submodel, inner)
    return messages


def _unknown_key_message(path: tuple[str, ...], valid: list[str]) -> str:
    close = difflib.get_close_matches(path[-1], valid, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"valid: {', '.join(valid)}"
    return f"unknown config key {'.'.join(path)!r} ({hint})"


def _submodel(annotation: Any) -> type[BaseModel] | None:
    from typing import get_args

    candidates = [annotation, *get_args(annotation)]
    for candidate in candidates:
        inner = get_args(candidate) or (candidate,)
        for c in inner:
            if isinstance(c, type) and issubclass(c, BaseModel):
                return c
    return None


def _describe(error: dict[str, Any]) -> str:
    location = ".".join(str(p) for p in error["loc"]) or "config"
    return f"  {location}: {error['msg']}"
