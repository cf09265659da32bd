"""Fixtures of the Megatron tests: running a rank script under ``torchrun`` on the CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from envhub.defaults import free_port

HERE = Path(__file__).resolve().parent
COMPAT = HERE / "cpu_compat.py"
"""The CPU compatibility module every rank loads before Megatron builds anything."""


def torchrun(
    script: str,
    args: list[str],
    *,
    world: int,
    setup: Path | None = COMPAT,
    env: dict[str, str] | None = None,
    timeout: float = 300,
) -> None:
    """``script`` (a file here) on ``world`` ranks under ``torchrun``, one thread each; fails the
    test with the ranks' stderr if it fails. ``setup``: the CPU compatibility (``None`` on
    GPUs)."""
    environ = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    environ.pop("ENVHUB_MEGATRON_WORKER_SETUP", None)
    if setup is not None:
        environ["ENVHUB_MEGATRON_WORKER_SETUP"] = str(setup)
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={world}",
               f"--master-port={free_port()}", str(HERE / script), *args]  # fmt: skip
    result = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-4000:]


@pytest.fixture(scope="session")
def run_torchrun() -> Callable[..., None]:
    """:func:`torchrun`, for tests (a fixture: test modules cannot import each other)."""
    return torchrun
