"""What every part of the training configuration shares: its base class and the env-name type.

Apart from the ``config`` package so that the config models of the algorithms that live in
packages of their own (``sft/config.py``, ``distill/config.py``) can use them without importing
the whole run config (which imports theirs). Imports no ML library.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict


class ConfigPart(BaseModel):
    """A section of the run config: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _absolute_env_file(name: str) -> str:
    """An env file's reference (``path/file.py[:Class]``) with the path made absolute, so
    that the run's ``config.json`` finds the env again from any folder (and so do rollout
    workers); any other name as it is."""
    from envhub.references import parse_reference

    ref = parse_reference(name)
    if ref is None or ref.path is None:
        return name
    path = str(ref.path.expanduser().absolute())
    return f"{path}:{ref.attr}" if ref.attr else path


EnvName = Annotated[str, AfterValidator(_absolute_env_file)]
"""An env name or reference; a file reference is stored with its path made absolute."""
