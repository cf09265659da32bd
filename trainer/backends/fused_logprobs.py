"""The trained tokens' logprobs and entropies, one fused pass per chunk of positions.

Op by op, a chunk's log-softmax-gather is a dozen kernels that each read ``positions x V``
floats (the float32 cast, the division by the temperature, max, subtract, exp, sum, log,
gather, and the entropy's again): on an H200 a quarter of a 0.5B update's device time went
there. :func:`fused_logprobs` computes, per chunk of ``rows`` positions, the target's logprob,
the log-partition and the entropy from the logits as they are (bf16 on GPUs), and in the
backward pass the logits' gradient from the saved log-partition. With ``compiled`` each of the
two is one ``torch.compile``d function (Triton on CUDA, C++ on the CPU): a reduction kernel or
two instead of a dozen launches, and no float32 copy of the logits.

The entropy comes back without a gradient (a metric); an entropy loss term takes the eager path
(``algorithms.token_entropy``). One rank's whole vocabulary: under tensor parallelism the
reductions need collectives between the steps (``megatron.loss.chunked_logprobs``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

CHUNK_ROWS = 1024
"""Positions per chunk: a chunk's float32 temporaries are ``rows x V`` (0.6 GB for a 152k
vocabulary; compiled, inductor keeps fewer)."""


def chunk_forward(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(logprob, log_partition, entropy)`` of each row of ``logits / temperature`` (``[r,
    V]``, any float dtype, computed in float32) for ``targets`` (``[r]``); ``[r]`` each."""
    z = logits.float() / temperature
    peak = z.amax(dim=-1, keepdim=True)
    exp = (z - peak).exp()
    total = exp.sum(-1)
    log_partition = peak[:, 0] + total.log()
    # A -inf logit (a masked vocabulary) has probability 0: its term is 0, not 0 * -inf.
    weighted = torch.where(exp > 0, exp * z, 0.0).sum(-1)
    entropy = log_partition - weighted / total
    logprob = z.gather(-1, targets[:, None])[:, 0] - log_partition
    return logprob, log_partition, entropy


def chunk_backward(
    logits: torch.Tensor,
    targets: torch.Tensor,
    log_partition: torch.Tensor,
    grad: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    """The gradient of ``sum(grad * logprob)`` with respect to ``logits`` (``[r, V]``, in its
    dtype): ``(onehot(target) - softmax) * grad / temperature``."""
    z = logits.float() / temperature
    scale = (grad.float() / temperature)[:, None]
    probs = (z - log_partition[:, None]).exp()
    onehot = torch.zeros_like(z).scatter_(-1, targets[:, None], 1.0)
    return ((onehot - probs) * scale).to(logits.dtype)


@functools.cache
def _kernels(compiled: bool) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The chunk functions, compiled once per process (``dynamic``: a last, shorter chunk and
    another vocabulary reuse the same kernels)."""
    if not compiled:
        return chunk_forward, chunk_backward
    return (
        torch.compile(chunk_forward, dynamic=True),
        torch.compile(chunk_backward, dynamic=True),
    )


def fused_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    *,
    rows: int = CHUNK_ROWS,
    compiled: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprobs of ``targets`` under ``softmax(logits / temperature)`` and that distribution's
    entropy, ``rows`` positions at a time (see the module docstring).

    Args:
        logits: ``(..., V)`` logits, any float dtype. Not modified; kept for the backward pass
            as they are (no float32 copy).
        targets: ``(...)`` token ids.
        temperature: What the logits are divided by.
        rows: Positions per chunk.
        compiled: Run the chunk functions ``torch.compile``d; ``False`` runs the same
            functions eagerly (the reference).

    Returns:
        ``(logprobs, entropy)``, ``(...)`` float32 each; only the logprobs carry a gradient.
    """
    return _Fused.apply(logits, targets, temperature, rows, compiled)


class _Fused(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        targets: torch.Tensor,
        temperature: float,
        rows: int,
        compiled: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        forward, _ = _kernels(compiled)
        flat, ids = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1).long()
        outputs = [torch.empty(flat.shape[0], device=flat.device) for _ in range(3)]
        for start in range(0, flat.shape[0], rows):
            window = slice(start, start + rows)
            parts = forward(flat[window], ids[window], temperature)
            for out, part in zip(outputs, parts, strict=True):
                out[window] = part
        logprob, log_partition, entropy = outputs
        ctx.save_for_backward(logits, ids, log_partition)
        ctx.temperature, ctx.rows, ctx.compiled = temperature, rows, compiled
        entropy = entropy.reshape(targets.shape)
        ctx.mark_non_differentiable(entropy)
        return logprob.reshape(targets.shape), entropy

    @staticmethod
    def backward(
        ctx: Any, grad: torch.Tensor, _entropy_grad: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        logits, ids, log_partition = ctx.saved_tensors
        _, backward = _kernels(ctx.compiled)
        flat, grad = logits.reshape(-1, logits.shape[-1]), grad.reshape(-1)
        out = torch.empty_like(flat)
        for start in range(0, flat.shape[0], ctx.rows):
            window = slice(start, start + ctx.rows)
            out[window] = backward(
                flat[window], ids[window], log_partition[window], grad[window], ctx.temperature
            )
        return out.reshape(logits.shape), None, None, None, None
