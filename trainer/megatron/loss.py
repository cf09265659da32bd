"""Token logprobs and entropies from vocabulary-parallel logits.

Under tensor parallelism each rank holds a slice of the vocabulary's logits. The full softmax
needs three reductions across the tensor-parallel group (max, sum of exponentials, and for the
entropy the sum of ``p * logit``); the autograd-aware reductions send each rank the gradient of
its own slice, so the loss is the same on every tensor rank and so are the gradients a single
process would get.
"""

from __future__ import annotations

import torch


def vocab_parallel_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)[target]`` over the whole (tensor-split) vocabulary.

    Args:
        logits: ``(..., V / tp)`` float logits of this rank's vocabulary slice (already divided
            by the temperature). Not modified.
        targets: ``(...)`` token ids in the whole vocabulary.
    """
    from megatron.core import tensor_parallel

    # megatron's kernel subtracts the max in place: give it its own copy.
    return -tensor_parallel.vocab_parallel_cross_entropy(logits.clone(), targets)


def vocab_parallel_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of ``softmax(logits)`` over the whole vocabulary, ``(...)``, differentiable."""
    from megatron.core import parallel_state as mpu
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    peak = logits.detach().amax(dim=-1, keepdim=True)
    if mpu.get_tensor_model_parallel_world_size() > 1:
        torch.distributed.all_reduce(
            peak, op=torch.distributed.ReduceOp.MAX, group=mpu.get_tensor_model_parallel_group()
        )
    shifted = logits - peak
    exp = shifted.exp()
    partition = reduce_from_tensor_model_parallel_region(exp.sum(dim=-1))
    weighted = reduce_from_tensor_model_parallel_region((exp * shifted).sum(dim=-1))
    return partition.log() - weighted / partition


@torch.no_grad()
def vocab_parallel_entropy_report(logits: torch.Tensor, rows: int = 1024) -> torch.Tensor:
    """:func:`vocab_parallel_entropy` without a gradient (a metric), ``rows`` token positions at a
    time: the softmax temporaries of a whole micro-batch (three ``tokens x V / tp`` float
    tensors, 7.5 GB for 4096 tokens of a 152k vocabulary) made a 1.5B model run out of memory
    on an 80 GB GPU."""
    flat = logits.reshape(-1, logits.shape[-1])
    parts = [vocab_parallel_entropy(flat[i : i + rows]) for i in range(0, flat.shape[0], rows)]
    return torch.cat(parts).reshape(logits.shape[:-1]) if parts else flat.new_zeros(0)
