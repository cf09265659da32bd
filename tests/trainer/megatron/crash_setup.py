"""Test-only worker setup: the CPU compatibility, plus a crash on demand.

With ``ENVHUB_TEST_CRASH_RANK=R`` and ``ENVHUB_TEST_CRASH_UPDATE=N`` set, rank ``R``'s process
exits abruptly (``os._exit``, no clean-up, as an OOM kill would) when its ``N``-th update
starts; the other ranks are left waiting in a collective.
"""

from __future__ import annotations

import os
import runpy
from pathlib import Path
from typing import Any

import torch

from envhub.trainer.megatron.worker import MegatronWorker

runpy.run_path(str(Path(__file__).with_name("cpu_compat.py")))

_update = MegatronWorker.update


def _crashing_update(self: MegatronWorker, *args: Any, **kwargs: Any) -> Any:
    rank, at = os.environ.get("ENVHUB_TEST_CRASH_RANK"), os.environ.get("ENVHUB_TEST_CRASH_UPDATE")
    if rank == str(torch.distributed.get_rank()) and at == str(self.updates + 1):
        os._exit(1)
    return _update(self, *args, **kwargs)


if os.environ.get("ENVHUB_TEST_CRASH_RANK"):
    MegatronWorker.update = _crashing_update
