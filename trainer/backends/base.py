"""The train-backend interface the loop talks to.

A backend owns the policy model and its optimizer. It cuts each update's batch into
micro-batches of token sequences (padded or packed, as it runs them), returns their logprobs
(before an update) and performs updates. Everything about devices, parallelism, padding and
model formats stays behind this interface, so a Megatron backend plugs in without changing the
loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from envhub.trainer.algorithms import ObjectiveSpec
from envhub.trainer.batch import Batch, MicroBatch, Sample, collate

if TYPE_CHECKING:
    from envhub.trainer.weight_sync import TransferPlan, WeightSender


@dataclass
class StepResult:
    """Metrics of one optimizer update (token-weighted means over its micro-batches)."""

    metrics: dict[str, float] = field(default_factory=dict)
    token_logprobs: list[torch.Tensor] | None = None
    """Per micro-batch, the logprobs the loss saw (laid out like ``MicroBatch.loss_mask``), for
    the run's record; ``None`` where a backend does not return them."""


class TrainBackend(Protocol):
    """What the training loop needs from a backend."""

    tokenizer: Any
    """The HF tokenizer of the policy (chat template, pad id)."""
    model_path: str
    """The local folder (or Hub id) the policy was loaded from; a vLLM engine starts from it."""
    autocast_dtype: torch.dtype | None
    """The dtype the policy computes in under autocast (``None``: in its parameters' own
    dtype); a critic beside it computes in the same."""

    @property
    def pad_id(self) -> int:
        """The id that pads micro-batches: the tokenizer's pad id, else its end-of-sequence
        id (a critic pads the same sequences with it)."""
        ...

    def num_parameters(self, trainable_only: bool = False) -> int:
        """The policy's parameter count (elements); ``trainable_only``: those that learn."""
        ...

    @property
    def model(self) -> torch.nn.Module:
        """The policy module (the in-process engine generates with it)."""
        ...

    def micro_batches(self, batch: Batch) -> list[MicroBatch]:
        """This update's micro-batches, padded or packed (``batch.Packing``) as this backend runs
        them, each within ``backend.micro_batch_tokens`` (padding counted when padded)."""
        ...

    def logprobs(
        self, batches: list[MicroBatch], reference: bool = False, temperature: float | None = None
    ) -> list[torch.Tensor]:
        """Per-target-token logprobs of each micro-batch under the current (or reference) policy,
        without gradients, shaped like ``MicroBatch.loss_mask``; at the rollout temperature
        unless ``temperature`` is given."""
        ...

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy's full weights in HF checkpoint format (names as in ``model.safetensors``,
        LoRA merged), one tensor at a time: what the rollout engine loads after each step."""
        ...

    def weight_sender(self, plan: TransferPlan) -> WeightSender | None:
        """A sender of this backend's own that moves the weights to the engines as ``plan``
        says, from the processes that hold them; ``None`` when the driver should send what
        :meth:`weights` yields (see ``trainer/weight_sync/``)."""
        ...

    def update(
        self,
        batches: list[MicroBatch],
        spec: ObjectiveSpec,
        *,
        old_logprobs: list[torch.Tensor] | None,
        ref_logprobs: list[torch.Tensor] | None,
        num_tokens: int,
        num_sequences: int,
    ) -> StepResult:
        """One optimizer update over ``batches`` (gradient accumulation), normalised by the
        totals of the whole update so the result does not depend on the micro-batch split."""
        ...

    def state(self) -> dict[str, Any]:
        """What a checkpoint holds: ``model``, ``optimizer``, ``scheduler`` (and ``tokenizer``),
        as :meth:`CheckpointManager.save` takes them."""
        ...

    def export(self, target: Path) -> Path:
        """Write the policy as an HF folder (safetensors) that vLLM and transformers load."""
        ...

    @property
    def device(self) -> torch.device:
        """Where the policy's tensors live (``cuda`` when it trains on GPUs)."""
        ...

    def describe(self) -> str:
        """Where the policy trains, for the run's header (``cpu``, ``cuda:0``,
        ``megatron tp=2 pp=1 dp=4 (8 GPUs x 1 nodes)``)."""
        ...

    def close(self) -> None:
        """Release what the backend holds outside this process (workers); idempotent."""
        ...


def sequence_logprobs(
    backend: TrainBackend, ids: list[int], temperature: float | None = None
) -> list[float]:
    """Logprob of each token of ``ids`` after the first under ``backend``'s policy (at the
    rollout temperature unless ``temperature`` is given): one unpadded sequence, scored as the
    loss scores it."""
    batch = collate([Sample(list(ids), [1] * len(ids), [0.0] * len(ids), 0.0, 0)], [0], pad_id=0)
    return backend.logprobs([batch], temperature=temperature)[0][0].tolist()
