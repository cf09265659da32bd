"""A Megatron rank's process before its model: the optional setup file, then torch.distributed
from the environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``,
``LOCAL_RANK``)."""

from __future__ import annotations

import importlib.util
import os
import sys

import torch

SETUP_ENV = "ENVHUB_MEGATRON_WORKER_SETUP"
"""A Python file every rank runs before building anything (the tests' CPU compatibility)."""


def run_setup_file() -> None:
    """Run the Python file ``$ENVHUB_MEGATRON_WORKER_SETUP`` names, if any, before anything is
    built (the tests' CPU compatibility)."""
    path = os.environ.get(SETUP_ENV)
    if not path:
        return
    spec = importlib.util.spec_from_file_location("envhub_megatron_worker_setup", path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"{SETUP_ENV}={path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    # Registered, as an import would: torch.compile re-imports the globals of what it traces.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)


def init_distributed() -> torch.device:
    """torch.distributed from the environment: NCCL on this rank's GPU, else gloo."""
    if torch.cuda.is_available():
        # Under Ray a rank sees only its own GPU (as cuda:0); under torchrun it sees the node's.
        device = torch.device(
            "cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
        )
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend, init_method="env://")
    return device
