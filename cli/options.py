"""Command-line options read from the pydantic settings they fill, so a default is written once:
in the settings model."""

from __future__ import annotations

from typing import Any

import typer
from pydantic import BaseModel


def settings_option(model: type[BaseModel], name: str, *flags: str, help: str,
                    **options: Any) -> Any:  # fmt: skip
    """The option ``--NAME`` (or the first of ``flags`` when it is a long one; the others
    beside it) for ``model``'s field ``name``, its default the field's (a default factory's
    value when the field has one)."""
    field = model.model_fields[name]
    default = field.default_factory() if field.default_factory is not None else field.default
    if not (flags and flags[0].startswith("--")):
        flags = (f"--{name.replace('_', '-')}", *flags)
    return typer.Option(default, *flags, help=help, **options)
