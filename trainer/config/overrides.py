"""``key=value`` overrides applied to a config dict, and what a change of envs drops from the
file (its run name, its held-out evaluation, the old envs' arguments). Nothing is validated
here: :func:`~envhub.trainer.config.loading.validate_config` names unknown keys afterwards."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from envhub.errors import ConfigError


def apply_overrides(
    data: dict[str, Any], overrides: Sequence[str] | Mapping[str, Any]
) -> dict[str, Any]:
    """Set each override in ``data`` (in place; also returned): ``"key.sub=value"`` strings,
    the value parsed as YAML as on the command line, or a mapping of dotted keys to values.

    Raises:
        ConfigError: A string without ``=``, or an index past a list's end.
    """
    pairs = overrides.items() if isinstance(overrides, Mapping) else map(parse_override, overrides)
    for key, value in pairs:
        _set_dotted(data, key, value)
    return data


def parse_override(text: str) -> tuple[str, Any]:
    """``"key=value"`` as ``(key, value)``, the value parsed as YAML (kept as text when it is
    not YAML; ``None`` when empty).

    Raises:
        ConfigError: No ``=``, or nothing before it.
    """
    import yaml

    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(
            f"override {text!r} must look like section.key=value (e.g. optimizer.lr=1e-6)"
        )
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """Set ``a.b.c`` in nested dicts; numeric parts index lists (``envs.0.args.difficulty``).

    Unknown keys are set like known ones: :func:`validate_config` names them all afterwards, in
    the same words as a typo in the YAML file.
    """
    parts = key.split(".")
    node: Any = data
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(
                    f"override {key}: {'.'.join(parts[:i]) or part} has no item {part}"
                )
            if last:
                node[int(part)] = value
            else:
                node = node[int(part)]
            continue
        if last:
            node[part] = value
        else:
            node = node.setdefault(part, {})
            if not isinstance(node, (dict, list)):
                raise ConfigError(f"override {key}: {'.'.join(parts[: i + 1])} is not a section")


def follow_overridden_envs(
    data: dict[str, Any], file_envs: list[Any], override_keys: Sequence[str]
) -> list[str]:
    """Drop the file's run name and held-out evaluation when overrides changed the envs.

    A config's ``run_name`` (with ``resume: auto``) and its ``eval`` envs belong to the envs it
    was written for: kept for another env, the run would land in (and resume) the first env's
    run folder and evaluate on an env it never trains on. Either stays when an override sets it.

    Returns:
        One line per thing dropped, for the user.
    """
    if not file_envs or env_names(data) == file_envs:
        return []
    keys = set(override_keys)
    notes = _drop_old_envs_args(data, file_envs, keys)
    run_name = (data.get("logging") or {}).get("run_name")
    if run_name and not keys & {"logging", "logging.run_name"}:
        del data["logging"]["run_name"]
        notes.append(
            f"the envs were overridden, so the run is not named {run_name!r} as the config's "
            "envs' run is (logging.run_name=NAME to choose)"
        )
    trained = set(env_names(data))
    evaluated = [
        e.get("name") for e in (data.get("eval") or {}).get("envs") or [] if isinstance(e, dict)
    ]
    given = any(key in ("eval", "eval.envs") or key.startswith("eval.envs.") for key in keys)
    if evaluated and not trained >= set(evaluated) and not given:
        del data["eval"]
        notes.append(
            f"the envs were overridden, so the config's held-out evaluation on "
            f"{', '.join(map(str, evaluated))} is dropped (eval.envs=[...] to evaluate)"
        )
    return notes


def _drop_old_envs_args(
    data: dict[str, Any], file_envs: list[Any], override_keys: set[str]
) -> list[str]:
    """An env renamed by ``envs.N.name=...`` keeps none of the old env's ``args`` (unless
    ``envs.N.args...`` is overridden too): they were written for the old env."""
    notes = []
    for index, env in enumerate(data.get("envs") or []):
        if (
            not isinstance(env, dict)
            or index >= len(file_envs)
            or env.get("name") == file_envs[index]
        ):
            continue
        prefix = f"envs.{index}.args"
        if {"envs", f"envs.{index}"} & override_keys:  # the user wrote the whole env
            continue
        if env.get("args") and not any(
            k == prefix or k.startswith(prefix + ".") for k in override_keys
        ):
            notes.append(
                f"envs.{index} is now {env.get('name')}, so {file_envs[index]}'s args "
                f"{env['args']} are dropped ({prefix}.KEY=VALUE to give some)"
            )
            del env["args"]
    return notes


def env_names(data: dict[str, Any]) -> list[Any]:
    """The names in a config dict's ``envs`` list, as written (an item that is not a mapping
    as it is); ``[]`` without such a list."""
    envs = data.get("envs")
    if not isinstance(envs, list):
        return []
    return [e.get("name") if isinstance(e, dict) else e for e in envs]
