"""Token logprobs and entropies from vocabulary-parallel logits.

Under tensor parallelism each rank holds a slice of the vocabulary's logits. The full softmax
needs reductions across the tensor-parallel group (max, sum of exponentials, the target's logit,
and for the entropy the sum of ``p * logit``); each rank gets the gradient of its own slice, so
the loss is the same on every tensor rank and so are the gradients a single process would get.
"""

from __future__ import annotations

from typing import Any

import torch

CHUNK_ROWS = 1024
"""Token positions whose float32 softmax is held at once by the chunked functions (0.6 GB for a
152k vocabulary on one tensor rank)."""


def vocab_parallel_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of ``softmax(logits)`` over the whole vocabulary, ``(...)``, differentiable."""
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    peak = _tp_all_reduce(
        logits.detach().amax(dim=-1, keepdim=True), torch.distributed.ReduceOp.MAX
    )
    shifted = logits - peak
    exp = shifted.exp()
    partition = reduce_from_tensor_model_parallel_region(exp.sum(dim=-1))
    weighted = reduce_from_tensor_model_parallel_region((exp * shifted).sum(dim=-1))
    return partition.log() - weighted / partition


@torch.no_grad()
def vocab_parallel_entropy_report(
    logits: torch.Tensor, temperature: float = 1.0, rows: int = CHUNK_ROWS
) -> torch.Tensor:
    """:func:`vocab_parallel_entropy` of ``logits / temperature`` without a gradient (a metric),
    ``rows`` token positions at a time, in float32 whatever the logits' dtype: the softmax
    temporaries of a whole micro-batch (three ``tokens x V / tp`` float tensors, 7.5 GB for
    4096 tokens of a 152k vocabulary) made a 1.5B model run out of memory on an 80 GB GPU."""
    flat = logits.reshape(-1, logits.shape[-1])
    parts = [
        vocab_parallel_entropy(flat[window].float() / temperature)
        for window in _windows(flat.shape[0], rows)
    ]
    return torch.cat(parts).reshape(logits.shape[:-1]) if parts else flat.new_zeros(0).float()


def chunked_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, rows: int = CHUNK_ROWS
) -> torch.Tensor:
    """``log softmax(logits / temperature)[target]`` over the whole (tensor-split) vocabulary,
    differentiable, without a float32 copy of the logits: ``rows`` positions at a time in
    float32, the backward pass recomputing each chunk's softmax from the logits (kept as they
    are, e.g. bf16) and one float per position.

    megatron-core's ``vocab_parallel_cross_entropy`` on scaled float32 logits, which this
    replaces, held the scaled logits, a copy (its kernel works in place) and its saved softmax:
    three ``tokens x V / tp`` float32 tensors per micro-batch, 2.5 GB each for 4096 tokens of
    a 152k vocabulary. This holds the logits the model returned (1.2 GB in bf16).

    Args:
        logits: ``(..., V / tp)`` logits of this rank's vocabulary slice, any float dtype,
            unscaled. Not modified.
        targets: ``(...)`` token ids in the whole vocabulary.
        temperature: What the logits are divided by.
        rows: Positions per chunk.

    Returns:
        ``(...)`` float32 logprobs.
    """
    return _ChunkedLogprobs.apply(logits, targets, temperature, rows)


class _ChunkedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, logits: torch.Tensor, targets: torch.Tensor, temperature: float, rows: int
    ) -> torch.Tensor:
        flat, picked_ids = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
        local, inside = _local_targets(picked_ids, flat.shape[-1])
        logprobs = torch.empty(flat.shape[0], dtype=torch.float32, device=flat.device)
        log_partition = torch.empty_like(logprobs)
        for window in _windows(flat.shape[0], rows):
            z = flat[window].float() / temperature
            peak = _tp_all_reduce(z.amax(dim=-1), torch.distributed.ReduceOp.MAX)
            target = z.gather(-1, local[window, None])[:, 0] * inside[window]
            sums = _tp_all_reduce(torch.stack([(z - peak[:, None]).exp().sum(-1), target]))
            log_partition[window] = peak + sums[0].log()
            logprobs[window] = sums[1] - log_partition[window]
        ctx.save_for_backward(logits, local, inside, log_partition)
        ctx.temperature, ctx.rows = temperature, rows
        return logprobs.reshape(targets.shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        logits, local, inside, log_partition = ctx.saved_tensors
        flat = logits.reshape(-1, logits.shape[-1])
        grad = grad.reshape(-1).float() / ctx.temperature
        out = torch.empty_like(flat)
        for window in _windows(flat.shape[0], ctx.rows):
            z = flat[window].float() / ctx.temperature
            chunk = (z - log_partition[window, None]).exp().mul_(-grad[window, None])
            chunk.scatter_add_(-1, local[window, None], (grad[window] * inside[window])[:, None])
            out[window] = chunk.to(out.dtype)
        return out.reshape(logits.shape), None, None, None


def _windows(positions: int, rows: int) -> list[slice]:
    """``positions`` split into consecutive slices of at most ``rows``."""
    return [slice(i, i + rows) for i in range(0, positions, rows)]


def _local_targets(targets: torch.Tensor, local_vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each target's index in this tensor rank's vocabulary slice (0 where another rank holds
    it) and whether this rank holds it (float 1/0)."""
    from megatron.core import parallel_state as mpu

    start = mpu.get_tensor_model_parallel_rank() * local_vocab
    inside = (targets >= start) & (targets < start + local_vocab)
    local = torch.where(inside, targets - start, torch.zeros_like(targets))
    return local.long(), inside.float()


def _tp_all_reduce(tensor: torch.Tensor, op: Any = torch.distributed.ReduceOp.SUM) -> torch.Tensor:
    """``tensor`` reduced over the tensor-parallel group in place (no-op on one rank)."""
    from megatron.core import parallel_state as mpu

    if mpu.get_tensor_model_parallel_world_size() > 1:
        torch.distributed.all_reduce(tensor, op=op, group=mpu.get_tensor_model_parallel_group())
    return tensor
