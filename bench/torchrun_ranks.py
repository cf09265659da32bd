"""Run a benchmark's ranks under ``torchrun`` and read back what rank 0 reports.

Rank 0 prints one line ``MARKER <json>``; :func:`run_ranks` returns that JSON, or raises with the
ranks' stderr when no rank reported (a crash in any rank).
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from envhub.defaults import free_port


def run_ranks(
    script: str, world: int, args: list[str], *, env: dict[str, str], marker: str, timeout: float
) -> Any:
    """``script args`` in ``world`` processes on this machine (a free rendezvous port)."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={world}",
        f"--master-port={port}",
        script,
        *args,
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    line = next(
        (line for line in result.stdout.splitlines() if line.startswith(marker + " ")), None
    )
    if line is None:
        raise RuntimeError(result.stderr[-4000:])
    return json.loads(line.removeprefix(marker + " "))
