"""An update in two verbs on a Megatron rank, as the training service's Tinker API splits it:
:meth:`SplitSteps.forward_backward` adds a batch's gradients (any number of times) and
:meth:`SplitSteps.optim_step` applies them with that call's Adam settings. Methods of
:class:`~envhub.trainer.megatron.worker.MegatronWorker`, kept apart from its one-call
``update`` (which this leaves as it is).

Megatron's DDP sums every backward pass into its gradient buffer, and each schedule ends with
``finalize_model_grads`` (the data-parallel sum, the pipeline's tied-embedding sum). Run at the
end of each ``forward_backward``, it would sum the earlier calls' already-summed gradients
again; so these schedules run without it, and ``optim_step`` finalizes once, before its step.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import torch

from envhub.trainer.batch import MicroBatch, Packing
from envhub.trainer.megatron.torch_adam import inner_optimizers

BatchLoss = Callable[[int, torch.Tensor], tuple[torch.Tensor, Any]]
"""``(micro-batch index, logprobs [n, width - 1] with grad) -> (loss, what to report)``: the
loss of one micro-batch's sequences, summed (gradients add up over micro-batches and
data-parallel ranks)."""


class SplitSteps:
    """The split update's half of a rank (see the module docstring)."""

    bridge: Any
    model: Any
    optimizer: Any
    updates: int
    _schedule: Callable[..., list[dict[str, Any]]]
    _my_batches: Callable[[list[MicroBatch]], list[tuple[int, MicroBatch]]]
    _row_logprobs: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
    _holds_output: Callable[[], bool]
    _is_output_rank: Callable[[], bool]

    def forward_backward(
        self,
        batches: list[MicroBatch],
        targets: list[torch.Tensor],
        loss: BatchLoss | None,
        forward_only: bool = False,
    ) -> dict[int, dict[str, Any]] | None:
        """Score ``batches`` and, unless ``forward_only``, add ``loss``'s gradients to the ones
        pending (no optimizer step).

        Args:
            batches: The micro-batches, dealt over the data-parallel ranks.
            targets: Per micro-batch, ``[n, width - 1]``: the token each position's logits
                score (laid out as ``MicroBatch.loss_mask``; need not be the next input token).
            loss: Each micro-batch's loss (:data:`BatchLoss`); ``None``: logprobs only.
            forward_only: Score without gradients.

        Returns:
            On the ranks that hold the output (:meth:`_holds_output`), per micro-batch index of
            this data rank's share: ``logprobs`` (``[n, width - 1]``, at temperature 1) and
            ``loss`` (what ``loss`` reported); ``None`` on the others.
        """

        def step(
            k: int, mb: MicroBatch, packing: Packing, row: torch.Tensor, output: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
            wanted = targets[max(k, 0)]  # a data rank's filler repeats micro-batch 0
            scored = packing.row(torch.cat([mb.input_ids[:, :1], wanted], dim=1))
            logprobs = packing.unpack(self._row_logprobs(output, scored, 1.0), wanted.shape[1] + 1)
            value, reported = (
                (logprobs.sum() * 0.0, None) if k < 0 or loss is None else loss(k, logprobs)
            )
            report = {"index": k, "logprobs": logprobs.detach().cpu(), "loss": reported}
            return value, torch.tensor(1, dtype=torch.int), report

        reports = self._unfinalized(batches, step, forward_only)
        if not self._holds_output():
            return None
        return {r["index"]: r for r in reports if r["index"] >= 0}

    def _unfinalized(
        self, batches: list[MicroBatch], step: Callable, forward_only: bool
    ) -> list[dict[str, Any]]:
        """``batches`` through the schedule without ``finalize_model_grads`` (the module
        docstring says why); without gradients when ``forward_only``."""
        config = self.bridge.config
        finalize, config.finalize_model_grads_func = config.finalize_model_grads_func, None
        grad = torch.no_grad() if forward_only else contextlib.nullcontext()
        self.model.train()
        try:
            with grad:
                return self._schedule(
                    self.model, self._my_batches(batches), step, forward_only=forward_only
                )
        finally:
            config.finalize_model_grads_func = finalize

    def optim_step(self, adam: dict[str, float]) -> float | None:
        """Apply the pending gradients with ``adam``'s settings (``learning_rate``, ``beta1``,
        ``beta2``, ``eps``, ``weight_decay``, and ``grad_clip_norm``: 0 for none), then clear
        them.

        Returns:
            The gradient norm before clipping on the output rank, else ``None``.
        """
        self.bridge.config.finalize_model_grads_func([self.model])
        for group in self.optimizer.param_groups:
            group["lr"] = adam["learning_rate"]
            group["betas"] = (adam["beta1"], adam["beta2"])
            group["eps"] = adam["eps"]
            group["weight_decay"] = adam["weight_decay"]
        for inner in inner_optimizers(self.optimizer):  # no clip: an infinite limit (the norm)
            inner.config.clip_grad = adam["grad_clip_norm"] or math.inf
        _, grad_norm, _ = self.optimizer.step()
        self.discard_gradients()
        self.updates += 1
        return float(grad_norm or 0.0) if self._is_output_rank() else None

    def discard_gradients(self) -> None:
        """Drop the pending gradients."""
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
