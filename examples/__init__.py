"""The training configs shipped with envhub, installed as ``envhub.examples``.

This folder is the only copy: a checkout runs ``envhub train examples/quickstart.yaml``, a pip
install runs ``envhub train --example quickstart``, and ``envhub examples`` lists them both ways.
An example's name is its file name without ``.yaml``; its description is the first line of the
comment it opens with.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from envhub.errors import ConfigError

FOLDER = Path(__file__).parent
"""Where the YAML files are, in a checkout and in an installed package alike."""


def names() -> list[str]:
    """The shipped examples' names, sorted (``quickstart``, ...)."""
    return sorted(p.stem for p in FOLDER.glob("*.yaml"))


def path(name: str) -> Path:
    """The YAML file of the shipped example ``name``.

    Raises:
        ConfigError: no example has that name (the message suggests the nearest and lists all).
    """
    known = names()
    if name in known:
        return FOLDER / f"{name}.yaml"
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ConfigError(
        f"no shipped example named {name!r} ({hint}shipped: {', '.join(known)}; "
        "`envhub examples` describes them)"
    )


def description(name: str) -> str:
    """The first line of the example's opening comment (what it trains, on what hardware)."""
    first = path(name).read_text().splitlines()[0]
    return first.removeprefix("#").strip()
