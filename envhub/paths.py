"""Where envhub keeps caches and outputs."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$ENVHUB_CACHE``, else ``$XDG_CACHE_HOME/envhub``, else ``~/.cache/envhub``."""
    if "ENVHUB_CACHE" in os.environ:
        return Path(os.environ["ENVHUB_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "envhub"
