"""MkDocs hooks for the documentation site (named in mkdocs.yml).

The API reference reads the sources without importing them (griffe's static analysis). The
installed package maps other folders into it (``trainer/`` is ``envhub.trainer``, ``cli/`` is
``envhub.cli``: pyproject's ``package-dir``), which a reader of the ``envhub/`` folder alone
does not see. So before a build this writes ``build/docs-api/envhub/``: links to every entry of
``envhub/`` plus the mapped ones, the package as Python sees it, for mkdocstrings to read.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
API_SOURCES = ROOT / "build" / "docs-api"


def package_view(root: Path, into: Path) -> Path:
    """Write ``into/envhub``: links to ``root/envhub``'s entries and to pyproject's mapped
    subpackages (``envhub.trainer`` -> ``root/trainer``, ...). Returns ``into/envhub``."""
    links = {entry.name: entry for entry in (root / "envhub").iterdir()}
    # pyproject's `package-dir = { "envhub.trainer" = "trainer", ... }` (no tomllib on 3.10)
    pyproject = (root / "pyproject.toml").read_text()
    for name, folder in re.findall(r'"envhub\.(\w+)" = "(\w+)"', pyproject):
        links[name] = root / folder
    view = into / "envhub"
    view.mkdir(parents=True, exist_ok=True)
    for name, target in links.items():
        link = view / name
        if link.is_symlink() and Path(os.readlink(link)) == target:
            continue
        temporary = view / f".{name}.{os.getpid()}"
        temporary.unlink(missing_ok=True)
        temporary.symlink_to(target)
        temporary.replace(link)  # atomic: a build running beside this one never sees a gap
    for stale in view.iterdir():  # entries since removed from envhub/
        if stale.name not in links and not stale.name.startswith("."):
            stale.unlink()
    return view


def on_config(config: Any) -> Any:
    """Refresh the package view (``mkdocs serve`` rebuilds after an edit)."""
    package_view(ROOT, API_SOURCES)
    return config


# Also now, as MkDocs loads this file with mkdocs.yml: mkdocstrings resolves its `paths` when it
# starts, before any `on_config`, and drops a path that does not exist yet (a fresh clone).
package_view(ROOT, API_SOURCES)
