"""A micro-batch's forward, loss and backward on the torch backend ask the device nothing: no op
whose result the host must read (``.item()``, a boolean-mask index, ``nonzero``), so on a GPU
the host queues the whole micro-batch without waiting. And the number of ops per micro-batch
stays what it is: a change that adds a per-layer or per-token op storm fails here.

The ops are counted with a ``TorchDispatchMode`` on the CPU, where every op the GPU would run
passes through the same dispatcher."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from envhub.trainer.algorithms import ObjectiveSpec, policy_objective
from envhub.trainer.backends.torch_backend import TorchBackend, place_for
from envhub.trainer.batch import Batch, Sample, micro_batches
from envhub.trainer.config import validate_config

pytest.importorskip("transformers")

SYNCING = ("aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.item")
"""Ops whose output the host reads or whose size depends on the data: each waits for the GPU."""

OPS_BUDGET = {"packed": 980, "padded": 800}
"""Ops of one micro-batch (forward, loss, backward) of a 2-layer Llama, about 15% over what
they were when this guard was written (848 packed, 695 padded). Over it: find the new ops
(``Counted.ops.most_common()``) before raising it."""


class Counted(TorchDispatchMode):
    """Counts every op dispatched while active, and records the ones that sync."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.syncs: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        self.ops[name] += 1
        if name.startswith(SYNCING) or _indexes_with_a_mask(name, args):
            self.syncs.append(name)
        return func(*args, **(kwargs or {}))


def _indexes_with_a_mask(name: str, args: tuple) -> bool:
    """An ``index``/``index_put`` whose indices include a boolean mask (a hidden ``nonzero``)."""
    if not name.startswith(("aten.index.", "aten.index_put")):
        return False
    indices = args[1] if len(args) > 1 else ()
    return any(getattr(t, "dtype", None) == torch.bool for t in indices or ())


def _uncounted(function):
    """``function`` run with the dispatch modes (the counting) off."""

    def run(*args, **kwargs):
        with _disable_current_modes():
            return function(*args, **kwargs)

    return run


def _backend(model_dir: Path, packing: str) -> TorchBackend:
    config = {
        "model": {"name": str(model_dir)},
        "envs": [{"name": "arithmetic"}],
        "backend": {"device": "cpu", "packing": packing},
    }
    return TorchBackend(validate_config(config))


def _batch() -> Batch:
    """Two samples sharing a prompt, one alone, one with a turn after a tool result."""
    generator = torch.Generator().manual_seed(0)
    masks = [[0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 1], [0, 0, 1, 1, 1, 0, 1], [0, 0, 1]]
    samples = []
    for i, mask in enumerate(masks):
        ids = torch.randint(0, 400, (len(mask),), generator=generator).tolist()
        if i < 2:
            ids[:4] = [1, 2, 3, 4]
        samples.append(Sample(ids, mask, [-1.0] * len(mask), 1.0 - 0.5 * i, i))
    return Batch(samples)


def _micro_batch_ops(backend: TorchBackend) -> Counted:
    (mb,) = backend.micro_batches(_batch())
    placed = place_for(backend.model, mb, backend.packed)  # the host's part
    moved = mb.to(backend.device)
    with Counted() as counted:
        logprobs, entropy = backend._scores(backend.model, placed, with_entropy=True)
        loss, _ = policy_objective(
            ObjectiveSpec(),
            logprobs=logprobs,
            old_logprobs=None,
            advantages=moved.advantages,
            mask=moved.loss_mask,
            num_tokens=10,
            num_sequences=4,
            sampler_logprobs=moved.sampler_logprobs,
            entropy=entropy,
        )
        loss.backward()
    return counted


@pytest.mark.parametrize("packing", ["packed", "padded"])
def test_a_micro_batch_never_waits_on_the_device(tiny_model_dir: Path, packing: str) -> None:
    backend = _backend(tiny_model_dir, packing)
    assert backend.packed == (packing == "packed")
    counted = _micro_batch_ops(backend)
    assert counted.syncs == []
    total = sum(counted.ops.values())
    assert total <= OPS_BUDGET[packing], counted.ops.most_common(15)


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
def test_an_update_reads_the_device_only_at_its_end(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = _backend(tiny_model_dir, "packed")
    batch = _batch()
    batches = micro_batches(batch, 7, backend.pad_id, packed=True, shared_prompts=True)
    assert len(batches) == 4
    # Not the device's: a micro-batch's host part (layouts, counts), and AdamW's step counters,
    # which stay on the host (``capturable=False``) and are read there once per parameter.
    monkeypatch.setattr(backend, "_place", _uncounted(backend._place))
    monkeypatch.setattr(backend.optimizer, "step", _uncounted(backend.optimizer.step))
    with Counted() as counted:
        result = backend.update(
            batches,
            ObjectiveSpec(),
            old_logprobs=None,
            ref_logprobs=None,
            num_tokens=batch.num_tokens,
            num_sequences=batch.num_sequences,
        )
    # the gradient norm (clipping) is the one scalar read; the metrics come back together, by a
    # ``tolist`` that no dispatch mode sees
    assert counted.syncs == ["aten._local_scalar_dense.default"]
    assert set(result.metrics) >= {"loss", "policy_loss", "entropy", "grad_norm", "lr"}
    assert len(result.token_logprobs) == 4
