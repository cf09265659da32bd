"""The pytest bundle for sandboxes: what it holds, that it is readable by others and built
once, and that a cache folder someone else could write is refused."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from envhub.checks import pytest_bundle as bundle


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(bundle, "CACHE_PARENT", str(tmp_path))
    return tmp_path / f"envhub-{os.geteuid()}"


PYTHON = shutil.which("python3", path=bundle.SYSTEM_PATH)


@pytest.mark.skipif(PYTHON is None, reason="no system python3")
def test_the_bundle_holds_pytest_and_its_dependencies_readable_by_all(cache: Path) -> None:
    folder = bundle._cache_root() / "pytest-x"
    bundle._build(folder, PYTHON)
    for module in ("pytest/__init__.py", "_pytest/main.py", "pluggy/__init__.py",
                   "iniconfig/__init__.py", "packaging/version.py"):  # fmt: skip
        assert (folder / module).is_file(), module
    modes = {stat.S_IMODE(p.stat().st_mode) for p in (folder, *folder.rglob("*"))}
    assert modes == {0o755, 0o644}
    before = (folder / "pytest/__init__.py").stat().st_mtime_ns
    bundle._build(folder, PYTHON)  # a second build (another process won the race) keeps the first
    assert (folder / "pytest/__init__.py").stat().st_mtime_ns == before
    assert [p.name for p in cache.iterdir()] == ["pytest-x"]  # no staging folder left


@pytest.mark.skipif(PYTHON is None, reason="no system python3")
def test_the_system_python_imports_the_bundle_from_its_bytecode(cache: Path) -> None:
    folder = bundle._cache_root() / "pytest-x"
    bundle._build(folder, PYTHON)
    done = subprocess.run(
        [PYTHON, "-v", "-c", "import pytest, _pytest.python"],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(folder), "PATH": bundle.SYSTEM_PATH},
    )
    # `python -v` says where each module's code came from: its bytecode, or its source.
    where = re.findall(rf"# code object from '{re.escape(str(folder))}/(\S+)'", done.stderr)
    tag = bundle._inspect(PYTHON)[1]
    assert f"_pytest/__pycache__/python.{tag}.pyc" in where
    assert len(where) > 40 and [w for w in where if not w.endswith(f".{tag}.pyc")] == []
