"""Every code block of the docs runs (or says why not): see tests/docs/blocks.py for the rules."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .blocks import LANGUAGES, ROOT, RUNNABLE, Block, all_blocks, python_program

BLOCKS = all_blocks()
TO_RUN = [b for b in BLOCKS if b.language in RUNNABLE and b.marker != "not-run"]


def environment() -> dict[str, str]:
    """The checkout's envhub first on the path; the venv's commands (envhub, pytest) first."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return {**os.environ, "PYTHONPATH": str(ROOT), "PATH": path, "NO_COLOR": "1"}


def test_every_block_is_runnable_or_says_why_not():
    assert len(BLOCKS) > 20, "the docs should have code blocks"
    for block in BLOCKS:
        assert block.language in LANGUAGES, f"{block.id}: a ```{block.language} block"
        if block.marker == "not-run":
            assert block.reason, f"{block.id}: `not-run` needs a reason"
        if block.marker == "continued":
            assert block.language == "python", f"{block.id}: only Python blocks continue"


@pytest.mark.parametrize("block", TO_RUN, ids=[b.id for b in TO_RUN])
def test_block_runs(block: Block, tmp_path: Path) -> None:
    # a block runs where a reader would (a folder of their own, the examples beside it), so
    # what it writes goes with the test's folder, not into the checkout or /tmp for good
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    if block.language == "python":
        done = subprocess.run(
            [sys.executable, "-c", python_program(block, BLOCKS)],
            cwd=tmp_path, env=environment(), capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    elif block.language == "bash":
        done = subprocess.run(
            ["bash", "-e", "-c", block.code],
            cwd=tmp_path, env=environment(), capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    else:
        check_config_fragment(block)
        return
    assert done.returncode == 0, f"{block.id} failed:\n{block.code}\n{done.stdout}\n{done.stderr}"


def check_config_fragment(block: Block) -> None:
    """A YAML block is part of a run config: on top of the quickstart's, it validates."""
    from envhub.trainer.config import validate_config

    fragment = yaml.safe_load(block.code)
    config = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    validate_config({**config, **fragment})
