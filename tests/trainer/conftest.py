"""Fixtures of the trainer tests.

``ShmEngine`` answers vLLM's weight-transfer HTTP routes for the ``envhub_shm`` backend the way
a vLLM server does, minus the model: each bucket is read out of the shared file with the real
worker side's decoding (``ShmUpdateInfo`` and its views) before the answer, and kept. Tests of a
sender that cannot afford a vLLM start (the Megatron ranks under torchrun) check with it exactly
what reached the engine and in which calls; the real vLLM path runs in ``tests/e2e``.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from typing import Any

import pytest


class ShmEngine:
    """One engine's side of ``envhub_shm`` (see the module docstring)."""

    def __init__(self, world_size: int = 1) -> None:
        self.world_size = world_size
        self.calls: list[str] = []
        """Every weight-transfer call's route, in order."""
        self.init_infos: list[dict[str, Any]] = []
        self.buckets: list[list[str]] = []
        self.received: dict[str, Any] = {}
        """The last value of every tensor sent, as the engine read it."""

    def __call__(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        if path == "/get_world_size":
            return 200, {"world_size": self.world_size}
        if path == "/update_weights":
            self._receive(body["update_info"])
        else:
            if path == "/init_weight_transfer_engine":
                self.init_infos.append(body["init_info"])
            self.calls.append(path.strip("/"))
        return 200, {}

    def _receive(self, update: dict[str, Any]) -> None:
        import torch

        from envhub.trainer.weight_sync.shm_backend import ShmUpdateInfo, _views

        info = ShmUpdateInfo(**update)
        with (
            open(info.path, "rb") as f,
            mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped,
        ):
            buffer = torch.frombuffer(bytearray(mapped), dtype=torch.uint8)
        self.received |= {name: view.clone() for name, view in _views(buffer, info)}
        self.buckets.append(info.names)
        self.calls.append("update_weights")


@pytest.fixture(scope="module")
def shm_engines(module_http_server: Callable) -> Callable[..., list[tuple[str, ShmEngine]]]:
    """``shm_engines(n)``: n engines on 127.0.0.1, as (URL, engine) pairs."""

    def start(n: int = 1, world_size: int = 1) -> list[tuple[str, ShmEngine]]:
        engines = [ShmEngine(world_size) for _ in range(n)]
        return [(module_http_server(engine).url, engine) for engine in engines]

    return start
