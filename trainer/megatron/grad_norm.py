"""A gradient norm for megatron-core's grad clipping that does not stop the host once per tensor.

Without Apex or Transformer Engine (a bare GPU image, as GPU.md's machines are) megatron-core
computes the total gradient norm with ``local_multi_tensor_l2_norm``, which turns each
parameter's norm into a Python float: one host-device sync per gradient tensor. An H200 trace of
one Qwen2.5-0.5B update counted 170 of its 247 syncs there (``bench/megatron_throughput.py
--trace-syncs``). :func:`grad_l2_norm` computes the same norm on the device with torch's own
``get_total_norm`` (one foreach kernel per dtype and device) and hands megatron the tensor it
expects, so the only sync left is megatron's single ``.item()`` of the total.
"""

from __future__ import annotations

from typing import Any

import torch


def grad_l2_norm(
    chunk_size: int, noop_flag: torch.Tensor, tensor_lists: list[list[torch.Tensor]], *args: Any
) -> tuple[torch.Tensor, None]:
    """The L2 norm of every tensor in ``tensor_lists`` together, as a one-element float32 tensor
    on their device: ``amp_C.multi_tensor_l2norm``'s signature and result (megatron-core passes
    ``per_tensor=False``, so no per-tensor norms are returned)."""
    tensors = [t for tensor_list in tensor_lists for t in tensor_list]
    if not tensors:
        return torch.zeros(1, dtype=torch.float32), None
    return torch.nn.utils.get_total_norm(tensors, 2.0).float().reshape(1), None


def use_device_grad_norm() -> bool:
    """Point megatron-core's grad clipping at :func:`grad_l2_norm` where it would use its own
    per-tensor fallback; a fused kernel (Apex, Transformer Engine) is left alone. Returns whether
    the fallback was replaced (idempotent)."""
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads

    if clip_grads.l2_norm_impl is not utils.local_multi_tensor_l2_norm:
        return clip_grads.l2_norm_impl is grad_l2_norm
    clip_grads.l2_norm_impl = grad_l2_norm
    return True
