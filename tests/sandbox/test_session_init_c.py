"""The compiled session init (:mod:`envhub.sandbox.session_init_c`): built once with the
system's ``cc`` into a folder only its owner can write, reused, and not used when asked for the
Python init or when that folder could be written by others. (Sessions run with it and without
it in ``test_session.py``.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from envhub.sandbox.session_init_c import compiled_init


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    """Each test asks again (the answer is cached for the process)."""
    compiled_init.cache_clear()
    yield
    compiled_init.cache_clear()


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler here")
def test_built_once_then_reused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    built = compiled_init()
    assert built is not None and built.parent == tmp_path / f"envhub-session-init-{os.geteuid()}"
    assert (built.stat().st_mode & 0o777, built.parent.stat().st_mode & 0o777) == (0o755, 0o711)
    stamp = built.stat().st_mtime_ns
    compiled_init.cache_clear()
    assert compiled_init() == built and built.stat().st_mtime_ns == stamp
    wrong = subprocess.run([str(built)], capture_output=True, check=False)  # no control socket
    assert wrong.returncode == 2


def test_not_used_when_asked_for_python(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVHUB_SESSION_INIT", "python")
    assert compiled_init() is None


def test_not_used_from_a_folder_others_can_write(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    folder = tmp_path / f"envhub-session-init-{os.geteuid()}"
    folder.mkdir()
    folder.chmod(0o777)
    assert compiled_init() is None and list(folder.iterdir()) == []


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler here")
def test_not_used_when_it_does_not_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    built = compiled_init()
    assert built is not None
    built.write_text("#!/bin/sh\nexit 0\n")  # not the init: a folder on a noexec mount fails so
    compiled_init.cache_clear()
    assert compiled_init() is None
