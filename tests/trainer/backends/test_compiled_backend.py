"""The torch backend's speed-ups, wired: the fused logprob pass and bucketed lengths score and
train a micro-batch as the plain path does; ``auto`` switches and ``backend.packing: auto``
follow their stated rules."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from envhub.trainer.backends import torch_backend, varlen
from envhub.trainer.backends.fused_logprobs import fused_logprobs
from envhub.trainer.backends.hf_model import packing_wanted
from envhub.trainer.backends.torch_backend import TorchBackend
from envhub.trainer.batch import Batch, Sample, micro_batches
from envhub.trainer.config import backend as backend_config
from envhub.trainer.config import validate_config
from envhub.trainer.config.backend import resolve_switch

pytest.importorskip("transformers")

CPU, CUDA = torch.device("cpu"), torch.device("cuda")  # device objects; nothing runs on CUDA


@pytest.mark.parametrize(
    ("choice", "on_cuda", "pays", "expected"),
    [(True, False, False, True), (False, True, True, False), ("auto", False, True, False),
     ("auto", True, False, False), ("auto", True, True, True)],
)  # fmt: skip
def test_a_switch_is_on_where_set_or_where_it_pays_on_cuda(
    monkeypatch: pytest.MonkeyPatch, choice: bool | str, on_cuda: bool, pays: bool, expected: bool
) -> None:
    monkeypatch.setitem(backend_config.PAYS_ON_CUDA, "compile.layers", pays)
    assert resolve_switch(choice, "compile.layers", on_cuda) is expected


@pytest.mark.parametrize(
    ("choice", "device", "autocast", "has_varlen", "pays", "packed"),
    [
        ("packed", CUDA, None, False, False, True),
        ("padded", CPU, None, True, True, False),
        ("auto", CPU, None, False, False, True),  # the CPU packs whatever the GPU checks say
        ("auto", CUDA, torch.bfloat16, True, False, False),  # not measured to pay (yet)
        ("auto", CUDA, torch.bfloat16, True, True, True),
        ("auto", CUDA, torch.bfloat16, False, True, False),  # no varlen_attn in this torch
        ("auto", CUDA, None, True, True, False),  # float32: the varlen kernel takes 16-bit only
    ],
)
def test_packing_auto_packs_on_cuda_only_with_varlen_where_it_measured_to_pay(
    monkeypatch: pytest.MonkeyPatch,
    choice: str,
    device: torch.device,
    autocast: torch.dtype | None,
    has_varlen: bool,
    pays: bool,
    packed: bool,
) -> None:
    monkeypatch.setitem(backend_config.PAYS_ON_CUDA, "packing", pays)
    monkeypatch.setattr(varlen, "available", lambda: has_varlen)
    assert packing_wanted(choice, device, autocast) is packed


@pytest.fixture(scope="module")
def shared(tiny_model_dir: Path) -> TorchBackend:
    """One backend for the module (loading one is most of a test's time)."""
    config = {
        "model": {"name": str(tiny_model_dir)},
        "envs": [{"name": "arithmetic"}],
        "backend": {"device": "cpu"},
        "rollout": {"temperature": 0.7},
    }
    return TorchBackend(validate_config(config))


@pytest.fixture
def backend(shared: TorchBackend) -> Iterator[TorchBackend]:
    """The shared backend, its switches put back after the test."""
    saved = shared.packed, shared.fused, shared.compiled_layers
    yield shared
    shared.packed, shared.fused, shared.compiled_layers = saved


def _micro_batch():
    """Three sequences of 7, 5 and 11 tokens (padded width 11, packed row 23)."""
    g = torch.Generator().manual_seed(3)
    masks = [[0, 0, 1, 1, 1, 0, 1], [0, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1]]
    samples = [
        Sample(torch.randint(0, 400, (len(m),), generator=g).tolist(), m, [0.0] * len(m), a, i)
        for i, (m, a) in enumerate(zip(masks, [1.0, -0.5, 0.25], strict=True))
    ]
    (mb,) = micro_batches(Batch(samples), 1024, pad_id=0)
    return mb


def _scores(backend: TorchBackend, mb) -> tuple[torch.Tensor, torch.Tensor, dict]:
    backend.model.zero_grad()
    logprobs, entropy = backend._token_logprobs(backend.model, mb, with_entropy=True)
    (logprobs * mb.loss_mask * mb.advantages).sum().backward()
    grads = {n: p.grad.clone() for n, p in backend.model.named_parameters() if p.grad is not None}
    return logprobs.detach(), entropy.detach(), grads


def _assert_same(ours: tuple, theirs: tuple, atol: float) -> None:
    torch.testing.assert_close(ours[0], theirs[0], rtol=0, atol=atol)
    torch.testing.assert_close(ours[1], theirs[1], rtol=0, atol=atol)
    assert ours[2].keys() == theirs[2].keys() and ours[2]
    for name, grad in ours[2].items():
        torch.testing.assert_close(grad, theirs[2][name], rtol=1e-4, atol=atol, msg=name)


@pytest.mark.parametrize("packed", [True, False])
def test_the_fused_pass_scores_and_trains_as_the_eager_one(
    backend: TorchBackend, monkeypatch: pytest.MonkeyPatch, packed: bool
) -> None:
    # The compiled kernels equal these eager chunks (test_fused_logprobs); this is the wiring.
    eager_chunks = functools.partial(fused_logprobs, compiled=False)
    monkeypatch.setattr(torch_backend, "fused_logprobs", eager_chunks)
    assert backend.packed and not backend.fused  # auto: on the CPU packed, not compiled
    backend.packed = packed
    mb = _micro_batch()
    plain = _scores(backend, mb)
    backend.fused = True
    _assert_same(_scores(backend, mb), plain, atol=1e-5)


@pytest.mark.parametrize(("packed", "bucket"), [(True, 32), (False, 16)])
def test_a_bucketed_length_scores_and_trains_as_the_exact_one(
    backend: TorchBackend, monkeypatch: pytest.MonkeyPatch, packed: bool, bucket: int
) -> None:
    backend.packed = packed
    mb = _micro_batch()
    plain = _scores(backend, mb)
    backend.compiled_layers = True  # bucketing alone: the layers stay eager here
    seen = []
    forward = backend.model.get_decoder().forward
    monkeypatch.setattr(
        backend.model.get_decoder(),
        "forward",
        lambda **kw: seen.append(kw["input_ids"].shape[1]) or forward(**kw),
    )
    _assert_same(_scores(backend, mb), plain, atol=1e-5)
    assert seen == [bucket]  # a packed row of 23 -> 32; a padded width of 11 -> 16


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("packing", ["packed", "padded"])
def test_on_a_gpu_the_compiled_backend_scores_and_trains_as_the_eager_one(
    tiny_model_dir: Path, packing: str
) -> None:
    """Triton kernels for the logprobs and the layers, under bf16 autocast: equal to the eager
    path within what bf16 rounding in another order gives."""
    results = []
    for compiled in (False, True):
        config = {
            "model": {"name": str(tiny_model_dir)},
            "envs": [{"name": "arithmetic"}],
            "backend": {"device": "cuda", "packing": packing,
                        "compile": {"logprobs": compiled, "layers": compiled}},
            "rollout": {"temperature": 0.7},
        }  # fmt: skip
        gpu = TorchBackend(validate_config(config))
        assert (gpu.fused, gpu.compiled_layers) == (compiled, compiled)
        results.append(_scores(gpu, _micro_batch()))
    eager, compiled = results
    torch.testing.assert_close(compiled[0], eager[0], rtol=0, atol=2e-2)
    torch.testing.assert_close(compiled[1], eager[1], rtol=0, atol=2e-2)
    for name, grad in compiled[2].items():
        assert (grad - eager[2][name]).norm() <= 0.02 * eager[2][name].norm() + 1e-6, name
