"""A Harbor task's limits (``[agent]``, ``[environment]``, ``[verifier]``, ``[solution]`` of its
``task.toml``) and what they become here.

========================================  =================================================
``task.toml``                             here
========================================  =================================================
``[agent] timeout_sec``                   the episode's time limit (stop reason
                                          ``time_limit``); no command of the episode runs
                                          longer than it
``[verifier] timeout_sec``                ``test.sh``'s wall time (default 600 s)
``[verifier] env``, ``[solution] env``    variables of ``test.sh``, of ``solve.sh``
``[environment] memory_mb`` (``memory``)  the session's ``memory_mb`` (per process address
                                          space)
``[environment] storage_mb`` (``storage``)  the session's ``disk_mb`` (its writable files)
``[environment] cpus``                    not enforced (a session has no CPU quota); more
                                          than this machine has is warned about
``[environment] gpus``                    refused when above 0: sessions have no GPU
``[environment] allow_internet = true``   warned about: sessions have no network
``[environment] build_timeout_sec``       each ``RUN`` step's wall time when the workspace
                                          is prepared (default 600 s;
                                          :mod:`envhub.harbor.build`)
========================================  =================================================

``memory`` and ``storage`` are Harbor's older spellings, sizes such as ``"4G"`` or ``"512M"``.
A value of the wrong type raises :class:`~envhub.errors.EnvLoadError` naming the file and field;
a value that cannot be honoured is refused
(:class:`~envhub.harbor.dockerfile.UnsupportedEnvironment`) or warned about (logged, and kept
on :attr:`Resources.warnings`), the field named either way.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envhub.errors import EnvLoadError
from envhub.harbor.dockerfile import UnsupportedEnvironment

logger = logging.getLogger(__name__)

DEFAULT_VERIFIER_TIMEOUT = 600.0
_UNITS = {"": 1.0, "K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0 * 1024}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Resources:
    """What a task's ``task.toml`` asks of the machine, checked."""

    verifier_timeout: float = DEFAULT_VERIFIER_TIMEOUT
    agent_timeout: float | None = None
    """Seconds the agent may work (``None``: the env's own budgets only)."""
    memory_mb: int | None = None
    storage_mb: int | None = None
    cpus: float | None = None
    build_timeout: float | None = None
    """Seconds each ``RUN`` step may run when the workspace is prepared (``None``: 600)."""
    verifier_env: dict[str, str] = field(default_factory=dict)
    solution_env: dict[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    """What is asked for but not honoured here, each naming its field."""


def read_resources(file: Path, config: dict[str, Any]) -> Resources:
    """The :class:`Resources` of the parsed ``task.toml`` at ``file``.

    Raises:
        EnvLoadError: A field of the wrong type or sign (named).
        UnsupportedEnvironment: The task needs a GPU.
    """
    agent, verifier = _section(config, "agent"), _section(config, "verifier")
    environment, solution = _section(config, "environment"), _section(config, "solution")
    where = str(file)
    gpus = _number(environment, "gpus", f"{where}: [environment] gpus", allow_zero=True)
    if gpus:
        raise UnsupportedEnvironment(
            f"{where}: [environment] gpus = {gpus:g}: envhub's sandbox sessions have no GPU"
        )
    cpus = _number(environment, "cpus", f"{where}: [environment] cpus")
    warnings = []
    if cpus is not None and cpus > (os.cpu_count() or 1):
        warnings.append(
            f"{where}: [environment] cpus = {cpus:g}, but this machine has {os.cpu_count()}; "
            "the task runs with what there is"
        )
    if environment.get("allow_internet") is True:
        warnings.append(
            f"{where}: [environment] allow_internet = true, but sandbox sessions have no "
            "network; the task runs offline"
        )
    for message in warnings:
        logger.warning("%s", message)
    verifier_timeout = _number(verifier, "timeout_sec", f"{where}: [verifier] timeout_sec")
    return Resources(
        verifier_timeout=verifier_timeout or DEFAULT_VERIFIER_TIMEOUT,
        agent_timeout=_number(agent, "timeout_sec", f"{where}: [agent] timeout_sec"),
        memory_mb=_size_mb(environment, "memory_mb", "memory", f"{where}: [environment]"),
        storage_mb=_size_mb(environment, "storage_mb", "storage", f"{where}: [environment]"),
        cpus=cpus,
        build_timeout=_number(
            environment, "build_timeout_sec", f"{where}: [environment] build_timeout_sec"
        ),
        verifier_env=_variables(verifier, f"{where}: [verifier] env"),
        solution_env=_variables(solution, f"{where}: [solution] env"),
        warnings=tuple(warnings),
    )


def _section(config: dict[str, Any], name: str) -> dict[str, Any]:
    value = config.get(name, {})
    return value if isinstance(value, dict) else {}


def _number(
    section: dict[str, Any], key: str, where: str, allow_zero: bool = False
) -> float | None:
    """``section[key]`` as a positive number (or zero), ``None`` when absent."""
    if key not in section:
        return None
    value = section[key]
    valid = not isinstance(value, bool) and isinstance(value, (int, float))
    if not valid or not (value >= 0 if allow_zero else value > 0):
        kind = "a number >= 0" if allow_zero else "a positive number"
        raise EnvLoadError(f"{where} must be {kind}, got {value!r}")
    return float(value)


def _size_mb(section: dict[str, Any], key: str, old_key: str, where: str) -> int | None:
    """``section[key]`` (MiB) or ``section[old_key]`` (a size such as ``"4G"``), in whole MiB."""
    number = _number(section, key, f"{where} {key}")
    if number is not None:
        return max(1, round(number))
    if old_key not in section:
        return None
    value = section[old_key]
    match = _SIZE.match(str(value)) if not isinstance(value, bool) else None
    if match is None or float(match.group(1)) <= 0:
        raise EnvLoadError(
            f'{where} {old_key} must be a size such as "4G" or "512M", got {value!r}'
        )
    return max(1, round(float(match.group(1)) * _UNITS[match.group(2).upper()]))


def _variables(section: dict[str, Any], where: str) -> dict[str, str]:
    value = section.get("env", {})
    if not isinstance(value, dict):
        raise EnvLoadError(f"{where} must be a table of variables, got {value!r}")
    return {str(k): str(v) for k, v in value.items()}
