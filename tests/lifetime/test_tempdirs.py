"""A killed process's temporary folders are removed by the next process of the same kind."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from envhub.lifetime.tempdirs import owned_tempdir


def test_a_new_folder_removes_those_whose_maker_is_gone_and_keeps_the_live_ones(
    tmp_path: Path,
) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    orphan = tmp_path / f"envhub-test-{gone.pid}-abc"
    live = tmp_path / f"envhub-test-{os.getpid()}-def"
    other = tmp_path / f"envhub-other-{gone.pid}-ghi"  # another prefix: not ours to judge
    for folder in (orphan, live, other):
        (folder / "inside").mkdir(parents=True)

    made = Path(owned_tempdir("envhub-test-", str(tmp_path)))

    assert made.is_dir() and made.name.startswith(f"envhub-test-{os.getpid()}-")
    assert not orphan.exists()
    assert live.is_dir() and other.is_dir()
