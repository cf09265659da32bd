"""``BackendWeightSource``: the trainer's weights as vLLM's weight transfer sends them."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

from envhub.trainer.weight_sync.trainer_side import BackendWeightSource  # noqa: E402

WEIGHTS = [("model.norm.weight", torch.full((2,), 1.5)), ("model.ids", torch.arange(3))]


def test_floats_travel_in_the_engine_dtype_and_integers_unchanged() -> None:
    source = BackendWeightSource(lambda: iter(WEIGHTS), dtype=torch.bfloat16, device="cpu")
    assert [(m.name, m.dtype, tuple(m.shape)) for m in source.metadata()] == [
        ("model.norm.weight", torch.bfloat16, (2,)), ("model.ids", torch.int64, (3,)),
    ]  # fmt: skip
    sent = dict(source)
    assert sent["model.norm.weight"].dtype == torch.bfloat16 and sent[
        "model.norm.weight"
    ].tolist() == [1.5, 1.5]
    assert torch.equal(sent["model.ids"], torch.arange(3))


@pytest.mark.gpu
def test_cpu_buckets_move_to_the_gpu_for_nccl() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    sent = dict(BackendWeightSource(lambda: iter(WEIGHTS), device="cuda"))
    assert all(t.is_cuda for t in sent.values())
