"""The device-side gradient norm handed to megatron-core's grad clipping (``grad_norm.py``).

The worker tests compare a whole update's ``grad_norm`` (clipping active) with the torch
backend's through it; these pin the function and the swap."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

from megatron.core import utils  # noqa: E402
from megatron.core.optimizer import clip_grads  # noqa: E402

from envhub.trainer.megatron.grad_norm import grad_l2_norm, use_device_grad_norm  # noqa: E402


def test_the_norm_of_all_lists_together_by_hand() -> None:
    lists = [[torch.tensor([3.0, 4.0]), torch.tensor([[12.0]])], [torch.tensor([0.0, 84.0])]]
    norm, per_tensor = grad_l2_norm(2048, torch.zeros(1, dtype=torch.int), lists, False)
    assert per_tensor is None
    assert norm.dtype == torch.float32 and norm.shape == (1,)
    assert norm.item() == 85.0  # sqrt(9 + 16 + 144 + 7056)


def test_bfloat16_gradients_give_a_float32_norm() -> None:
    norm, _ = grad_l2_norm(2048, None, [[torch.full((4,), 0.5, dtype=torch.bfloat16)]], False)
    assert norm.dtype == torch.float32 and norm.item() == 1.0


def test_it_replaces_only_megatrons_per_tensor_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clip_grads, "l2_norm_impl", utils.local_multi_tensor_l2_norm)
    assert use_device_grad_norm() is True
    assert clip_grads.l2_norm_impl is grad_l2_norm
    assert use_device_grad_norm() is True  # idempotent

    def fused(*args: object) -> None:  # what Apex or Transformer Engine would provide
        raise AssertionError("not called here")

    monkeypatch.setattr(clip_grads, "l2_norm_impl", fused)
    assert use_device_grad_norm() is False
    assert clip_grads.l2_norm_impl is fused
