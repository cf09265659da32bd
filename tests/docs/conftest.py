"""The documentation site, built once per session with warnings as errors (``mkdocs build
--strict``) into a temporary folder: the build test reads its log, the browser test walks it."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class BuiltSite:
    folder: Path
    returncode: int
    log: str


@pytest.fixture(scope="session")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> BuiltSite:
    folder = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)],
        cwd=ROOT,  # `python -m` puts the checkout first on sys.path: its hooks, its sources
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    return BuiltSite(folder, done.returncode, done.stdout + done.stderr)
