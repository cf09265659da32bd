"""The pytest bundle for sandboxes: what it holds, that it is readable by others and built
once, and that a cache folder someone else could write is refused."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from envhub import pytest_bundle as bundle


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(bundle, "CACHE_PARENT", str(tmp_path))
    return tmp_path / f"envhub-{os.geteuid()}"


def test_the_bundle_holds_pytest_and_its_dependencies_readable_by_all(cache: Path) -> None:
    folder = bundle._cache_root() / "pytest-x"
    bundle._build(folder)
    for module in ("pytest/__init__.py", "_pytest/main.py", "pluggy/__init__.py",
                   "iniconfig/__init__.py", "packaging/version.py"):  # fmt: skip
        assert (folder / module).is_file(), module
    assert not list(folder.rglob("__pycache__"))
    modes = {stat.S_IMODE(p.stat().st_mode) for p in (folder, *folder.rglob("*"))}
    assert modes == {0o755, 0o644}
    before = (folder / "pytest/__init__.py").stat().st_mtime_ns
    bundle._build(folder)  # a second build (another process won the race) keeps the first
    assert (folder / "pytest/__init__.py").stat().st_mtime_ns == before
    assert [p.name for p in cache.iterdir()] == ["pytest-x"]  # no staging folder left


def test_a_cache_folder_others_can_write_is_refused(cache: Path) -> None:
    cache.mkdir(mode=0o777)
    cache.chmod(0o777)
    with pytest.raises(PermissionError, match="only it can write"):
        bundle._cache_root()
