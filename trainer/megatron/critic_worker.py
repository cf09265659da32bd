"""One rank of the Megatron critic: the policy's megatron-core model with a value head.

A :class:`MegatronCriticWorker` is a :class:`MegatronWorker` (the same distributed set-up,
HF loading through mbridge, pipeline schedule, packing, optimizer and checkpoints) whose model
ends in a :class:`ValueHead` instead of the vocabulary-parallel output layer, and whose calls
are :meth:`values` and :meth:`update_values` instead of logprobs and the policy's update.

The head is one ``hidden -> 1`` linear layer, replicated on every tensor rank: the last
layer's hidden states are whole on each of them (no sequence parallelism), so every tensor rank
computes the same values and the same loss, and the gradient it sends back into its shard of
the trunk is the whole one, as a replicated layer's must be (no reduction across tensor ranks).
Megatron's grad norm counts a parameter without ``tensor_model_parallel`` once. The input
embedding is no longer tied to an output layer (``share_embeddings_and_output_weights`` off),
so pipeline stages do not all-reduce an embedding gradient the head does not have. The head
starts at zero, as the torch critic's (``torch_critic.zero_value_head``).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from envhub.trainer.algorithms import clipped_value_loss
from envhub.trainer.batch import MicroBatch, Packing
from envhub.trainer.megatron.micro_batches import micro_batch_report
from envhub.trainer.megatron.worker import MegatronWorker, WorkerSpec


class ValueHead(torch.nn.Module):
    """Stands in for GPTModel's output layer: ``[s, b, hidden] -> [s, b, 1]`` values, called as
    megatron-core calls its output layer (``weight=``, ``runtime_gather_output=``, returning an
    ``(output, bias)`` pair)."""

    def __init__(self, hidden_size: int, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        # ``weight`` and ``bias`` as the output layer's own names: megatron-core's sharded
        # state dict of a language model looks for ``output_layer.weight``.
        self.weight = torch.nn.Parameter(torch.zeros(1, hidden_size, dtype=dtype, device=device))
        self.bias = torch.nn.Parameter(torch.zeros(1, dtype=dtype, device=device))

    def forward(
        self,
        hidden_states: torch.Tensor,
        weight: torch.Tensor | None = None,
        runtime_gather_output: bool | None = None,
    ) -> tuple[torch.Tensor, None]:
        """The values of every position (``weight`` and ``runtime_gather_output`` are the
        vocabulary layer's and ignored)."""
        return torch.nn.functional.linear(hidden_states, self.weight, self.bias), None


class MegatronCriticWorker(MegatronWorker):
    """A critic rank (see the module docstring); built and called as a :class:`MegatronWorker`.

    Args:
        spec: The critic's model folder and optimizer settings (``reference`` off).
        value_clip: PPO's value clip (``critic.value_clip``), ``None`` for none.
    """

    def __init__(self, spec: WorkerSpec, value_clip: float | None = None) -> None:
        self.value_clip = value_clip
        super().__init__(spec)

    def _load(self, path: str) -> torch.nn.Module:
        model = super()._load(path)
        model.share_embeddings_and_output_weights = False
        if model.post_process:
            dtype = next(model.parameters()).dtype
            model.output_layer = ValueHead(model.config.hidden_size, dtype, self.device)
        return model

    @torch.no_grad()
    def values(self, batches: list[MicroBatch]) -> dict[int, torch.Tensor] | None:
        """Values of this data rank's share of ``batches`` (``[n, width - 1]`` each, place ``t``
        the state before token ``t + 1``), keyed by micro-batch index, on the first tensor rank
        of the last stage; ``None`` on the others (they still take part)."""
        return self._collect(
            self.model, batches, lambda mb, packing, row, output: _place_values(output, packing, mb)
        )

    def update_values(
        self,
        batches: list[MicroBatch],
        targets: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
        num_places: int,
    ) -> dict[str, float] | None:
        """One optimizer update of the critic: micro-batch ``k`` learns ``targets[k]`` (old
        values, returns, mask, laid out like its ``loss_mask``) with PPO's clipped value loss,
        normalised by the update's ``num_places``. Its metrics on the output rank, else
        ``None``."""
        return self._train_on(batches, partial(self._value_loss, targets, num_places))

    def _value_loss(
        self,
        targets: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
        num_places: int,
        k: int,
        mb: MicroBatch,
        packing: Packing,
        row: torch.Tensor,
        output: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        values = _place_values(output, packing, mb)
        if k < 0:  # a filler: nothing to learn
            old = returns = torch.zeros_like(values)
            mask = torch.zeros_like(values, dtype=torch.bool)
            weight = 0.0
        else:
            weight = float(targets[k][2].sum())  # counted on the host, before the move
            old, returns, mask = (t.to(values.device) for t in targets[k])
        loss, metrics = clipped_value_loss(
            values, old, returns, mask, clip=self.value_clip, num_tokens=num_places
        )
        return loss, torch.tensor(1, dtype=torch.int), micro_batch_report(loss, weight, metrics)


def _place_values(output: torch.Tensor, packing: Packing, mb: MicroBatch) -> torch.Tensor:
    """The packed row's ``[1, total, 1]`` head outputs as ``[n, width - 1]`` float values of
    the places that have a next token."""
    return packing.unpack(output[:, :-1, 0].float(), mb.input_ids.shape[1])
