"""``BackendWeightSource``: the trainer's weights as vLLM's weight transfer sends them."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

from envhub.trainer.engines.weight_sync import BackendWeightSource  # noqa: E402

WEIGHTS = [("model.norm.weight", torch.full((2,), 1.5)), ("model.ids", torch.arange(3))]


def test_floats_travel_in_the_engine_dtype_and_integers_unchanged() -> None:
    source = BackendWeightSource(lambda: iter(WEIGHTS), dtype=torch.bfloat16, device="cpu")
    assert [(m.name, m.dtype, tuple(m.shape)) for m in source.metadata()] == [
        ("model.norm.weight", torch.bfloat16, (2,)), ("model.ids", torch.int64, (3,)),
    ]  # fmt: skip
    sent = dict(source)
    assert sent["model.norm.weight"].dtype == torch.bfloat16 and sent["model.norm.weight"].tolist() == [1.5, 1.5]
    assert torch.equal(sent["model.ids"], torch.arange(3))


@pytest.mark.gpu
def test_cpu_buckets_move_to_the_gpu_for_nccl() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    sent = dict(BackendWeightSource(lambda: iter(WEIGHTS), device="cuda"))
    assert all(t.is_cuda for t in sent.values())


# -- EngineControlClient: rank 0's HTTP client of every engine (real sockets on 127.0.0.1) ------


def test_the_control_client_gives_each_engine_its_own_nccl_ranks(shm_engines) -> None:
    from envhub.trainer.engines.weight_sync import EngineControlClient

    (url_a, a), (url_b, b) = shm_engines(1, world_size=2) + shm_engines(1, world_size=3)
    client = EngineControlClient([url_a, url_b])
    try:
        assert client.world_sizes() == [2, 3]
        init = {"master_address": "10.0.0.1", "master_port": 29500, "rank_offset": 1, "world_size": 6}
        client.init_weight_transfer_engine(init)
        client.start_weight_update()
        client.finish_weight_update()
    finally:
        client.close()
    assert a.calls == b.calls == ["init_weight_transfer_engine", "start_weight_update", "finish_weight_update"]
    assert a.init_infos == [{**init, "rank_offset": 1}]
    assert b.init_infos == [{**init, "rank_offset": 3}]  # after a's two workers


def test_an_engine_that_refuses_or_is_gone_is_named(http_server) -> None:
    from envhub.errors import EngineError, EngineUnavailableError
    from envhub.trainer.engines.weight_sync import EngineControlClient

    refusing = http_server(lambda method, path, body: (500, "layer 3 is missing"))
    client = EngineControlClient([refusing.url, "http://127.0.0.1:9"], timeout_s=5)
    try:
        with pytest.raises(EngineError, match=rf"vLLM at {refusing.url}: /start_weight_update -> HTTP 500: layer 3 is missing"):
            client._call(0, "POST", "/start_weight_update", None)
        with pytest.raises(EngineUnavailableError, match=r"vLLM at http://127.0.0.1:9 did not answer /start_weight_update: ConnectError"):
            client._call(1, "POST", "/start_weight_update", None)
    finally:
        client.close()


def test_a_sender_outside_the_driver_needs_engine_urls() -> None:
    from envhub.errors import ConfigError
    from envhub.trainer.engines.weight_sync import EngineControlClient

    with pytest.raises(ConfigError, match="reaches vLLM over HTTP; this engine has no URL"):
        EngineControlClient([])
