"""How one sync reaches every engine: ``FanoutClient`` over the driver's receivers, and rank 0's
HTTP client of every server (real sockets on 127.0.0.1)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from envhub.errors import ConfigError, EngineError, EngineUnavailableError
from envhub.trainer.weight_sync import TransferPlan, transfers
from envhub.trainer.weight_sync.clients import FanoutClient, LoopThread
from envhub.trainer.weight_sync.ranks import RemoteEngines
from envhub.trainer.weight_sync.routes import VLLMRoutes

NCCL_INIT = {"master_address": "10.0.0.1", "master_port": 29500, "rank_offset": 1, "world_size": 6}


class Receiver:
    """An engine's weight-update calls, recorded."""

    url = None

    def __init__(self, world_size: int = 1) -> None:
        self.size = world_size
        self.calls: list[tuple[str, Any]] = []

    async def world_size(self) -> int:
        return self.size

    async def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.calls.append(("init", init_info))

    async def start_weight_update(self) -> None:
        self.calls.append(("start", None))

    async def update_weights(self, update_info: Any) -> None:
        self.calls.append(("update", update_info))

    async def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.calls.append(("finish", weight_version))


@pytest.fixture
def loop() -> Any:
    thread = LoopThread()
    yield thread.loop
    thread.close()


def test_one_sync_reaches_every_engine_with_its_own_nccl_ranks(
    loop: asyncio.AbstractEventLoop,
) -> None:
    a, b = Receiver(world_size=2), Receiver(world_size=3)
    client = FanoutClient(loop, [a, b], transfers.get("nccl"))
    assert client.world_sizes() == [2, 3]  # the trainer's group: 1 + 5 ranks
    client.init_weight_transfer_engine(NCCL_INIT)
    client.start_weight_update()
    client.update_weights({"names": ["w"]})
    client.finish_weight_update("7")
    assert a.calls == [
        ("init", {**NCCL_INIT, "rank_offset": 1}),
        ("start", None),
        ("update", {"names": ["w"]}),
        ("finish", "7"),
    ]
    assert b.calls == [
        ("init", {**NCCL_INIT, "rank_offset": 3}),
        ("start", None),
        ("update", {"names": ["w"]}),
        ("finish", "7"),
    ]  # after a's two workers


def test_without_ranks_every_engine_gets_the_same_init_info(
    loop: asyncio.AbstractEventLoop,
) -> None:
    a, b = Receiver(), Receiver()
    client = FanoutClient(loop, [a, b], transfers.get("envhub_shm"))
    client.init_weight_transfer_engine({"protocol": 1})
    assert a.calls == b.calls == [("init", {"protocol": 1})]


def test_rank_0s_client_gives_each_server_its_own_nccl_ranks(shm_engines) -> None:
    (url_a, a), (url_b, b) = shm_engines(1, world_size=2) + shm_engines(1, world_size=3)
    engines = RemoteEngines(
        TransferPlan("nccl", bucket_bytes=1 << 20, dtype=None, urls=(url_a, url_b))
    )
    try:
        assert engines.client.world_sizes() == [2, 3]
        engines.client.init_weight_transfer_engine(NCCL_INIT)
        engines.client.start_weight_update()
        engines.client.finish_weight_update()
    finally:
        engines.close()
    assert (
        a.calls
        == b.calls
        == ["init_weight_transfer_engine", "start_weight_update", "finish_weight_update"]
    )
    assert a.init_infos == [{**NCCL_INIT, "rank_offset": 1}]
    assert b.init_infos == [{**NCCL_INIT, "rank_offset": 3}]  # after a's two workers


def test_an_engine_that_refuses_or_is_gone_is_named(http_server) -> None:
    refusing = http_server(lambda method, path, body: (500, "layer 3 is missing"))

    async def call(url: str) -> None:
        routes = VLLMRoutes(url, timeout_s=5)
        try:
            await routes.start_weight_update()
        finally:
            await routes.aclose()

    with pytest.raises(
        EngineError,
        match=rf"vLLM at {refusing.url}: /start_weight_update -> HTTP 500: layer 3 is missing",
    ):
        asyncio.run(call(refusing.url))
    with pytest.raises(
        EngineUnavailableError,
        match=r"vLLM at http://127.0.0.1:9 did not answer /start_weight_update: ConnectError",
    ):
        asyncio.run(call("http://127.0.0.1:9"))


def test_a_sender_outside_the_driver_needs_engine_urls() -> None:
    with pytest.raises(ConfigError, match="reaches vLLM over HTTP; this engine has no URL"):
        RemoteEngines(TransferPlan("envhub_shm", bucket_bytes=1 << 20, dtype=None, urls=()))
