"""A run's env names, checked before anything heavy starts (``envhub train --dry-run`` too).

Each name in ``envs:`` and ``eval.envs:`` is resolved as ``envhub.make`` would resolve it, but no
env is constructed: an unknown name fails with the close ones, an env reference
(``file.py:Class``) with the cause (no such file, no such class, the error its code raised).
Served envs' URLs and Hub references are left to the run, which makes them.
"""

from __future__ import annotations

from envhub.errors import EnvLoadError, EnvNotFoundError
from envhub.trainer.config import TrainConfig


def check_env_names(config: TrainConfig) -> None:
    """Resolve every env the run names.

    Raises:
        EnvNotFoundError: A name names no env (the message says which config field).
        EnvLoadError: An env reference's file or module cannot be loaded.
    """
    from envhub.loader import resolve

    for field, name in _named_envs(config):
        try:
            resolve(name)
        except EnvNotFoundError as e:
            raise EnvNotFoundError(f"{field}: {e}") from None
        except EnvLoadError as e:
            raise EnvLoadError(f"{field}: {e}") from None


def _named_envs(config: TrainConfig) -> list[tuple[str, str]]:
    """``(config field, env name)`` for every env the run trains or evaluates on."""
    named = [(f"envs.{i}.name", spec.name) for i, spec in enumerate(config.envs)]
    if config.eval is not None:
        named += [(f"eval.envs.{i}.name", spec.name) for i, spec in enumerate(config.eval.envs)]
    return named
