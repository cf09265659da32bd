"""Env files as a user writes them from scratch (no pyproject, README or tests), for the tests of
env references (``path/to/file.py:Class``). Tests copy them into ``tmp_path``; the one the docs
show is ``examples/envs/lookup_sum.py``."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOOKUP_SUM = ROOT / "examples" / "envs" / "lookup_sum.py"
"""A tool env with two tools (``lookup``, ``add``) and a reward, no ``name`` or ``version``."""


def write_env_file(folder: Path, source: Path = LOOKUP_SUM, name: str | None = None) -> Path:
    """Copy ``source`` into ``folder`` (as ``name``, default its own); the copy's path."""
    target = folder / (name or source.name)
    target.write_text(source.read_text())
    return target
