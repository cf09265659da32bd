"""Command-line options read from the pydantic settings they fill, so a default is written once:
in the settings model."""

from __future__ import annotations

from typing import Any

import typer
from pydantic import BaseModel


def settings_option(model: type[BaseModel], name: str, *flags: str, help: str,
                    **options: Any) -> Any:  # fmt: skip
    """The option ``--NAME`` (with ``flags`` beside it) for ``model``'s field ``name``, its
    default the field's (a default factory's value when the field has one)."""
    field = model.model_fields[name]
    default = field.default_factory() if field.default_factory is not None else field.default
    return typer.Option(default, f"--{name.replace('_', '-')}", *flags, help=help, **options)
