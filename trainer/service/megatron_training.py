"""A full-weight training model of the service on the Megatron backend
(``envhub serve-trainer --backend megatron``).

The model's megatron-core ranks are Ray actors (:class:`~envhub.trainer.megatron.backend.
MegatronBackend`, one group of ranks per model, split as ``tensor_parallel`` x
``pipeline_parallel`` x the data parallelism that fills the GPUs left). Tinker's verbs map onto
the ranks' split update (:mod:`~envhub.trainer.megatron.worker_steps`):

- ``forward`` / ``forward_backward``: the datums become packed micro-batches (each datum its
  input tokens plus a placeholder, as on the torch backend); every rank scores its share at the
  datums' own ``target_tokens`` and runs the built-in loss (:class:`DatumLosses`, which travels
  to the ranks), adding its gradients to those pending there;
- ``optim_step``: the ranks sum the pending gradients over data-parallel replicas once and step
  megatron-core's Adam with the call's settings;
- ``save_state`` / ``load_state``: megatron-core's distributed checkpoint of model and optimizer
  shards (any split of the same model loads it);
- export: the whole model as an HF folder, written by rank 0, which the samplers load.

The service owns Ray: it starts it (or joins this process's) before any model
(:func:`start_ray`) and stops it only if it started it, so a model's ranks, stopped when its
session ends, and the vLLM sampler's engines, placed on Ray beside them, leave it up for the
others.

Refused, with a message that says what to do: LoRA (the torch backend trains adapters), and
uploaded custom losses and ``[T, K]`` targets (the torch backend runs them).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from envhub.errors import ConfigError
from envhub.trainer.batch import Batch, MicroBatch
from envhub.trainer.config import TrainConfig, validate_config
from envhub.trainer.megatron.backend import MegatronBackend, ShardedCheckpoint
from envhub.trainer.megatron.worker_io import WORKER_STATE
from envhub.trainer.service.losses import get_loss
from envhub.trainer.service.settings import ServiceSettings
from envhub.trainer.service.training import datum_samples, datum_targets, loss_inputs
from envhub.trainer.service.wire import Datum, ForwardRequest

LORA_REFUSED = (
    "this service trains full weights on the Megatron backend (serve-trainer --backend "
    "megatron), which has no LoRA: start it with --full-weights to train every weight of the "
    "models SDK loops create (the SDK asks for LoRA with each), create the model without a "
    "LoRA config, or train LoRA on a service started with --backend torch"
)


def megatron_config(model: str, seed: int, settings: ServiceSettings) -> TrainConfig:
    """The ``TrainConfig`` of a model's Megatron backend: logprobs at temperature 1, no
    clipping or schedule of its own (each ``optim_step`` says), the split of ``settings``.
    With the vLLM sampler, the model's sampler engine is Ray-placed beside its ranks
    (``rollout.vllm.mode: ray``, one engine): on GPUs the ranks leave it one of the node's."""
    split = {"tensor_parallel": settings.tensor_parallel,
             "pipeline_parallel": settings.pipeline_parallel}  # fmt: skip
    # what the Megatron backend samples with
    rollout: dict[str, Any] = {"engine": "vllm", "temperature": 1.0}
    if settings.sampler == "vllm":
        rollout["vllm"] = {"mode": "ray", "engines": 1}
    return validate_config({
        "model": {"name": model}, "seed": seed,
        "envs": [{"name": "arithmetic"}],  # a TrainConfig needs one; nothing rolls out here
        "rollout": rollout, "optimizer": {"grad_clip": None},
        "backend": {"kind": "megatron", "megatron": split},
    })  # fmt: skip


def service_ray_cpus(settings: ServiceSettings) -> int:
    """Logical CPUs of the local Ray cluster a Megatron-backed service starts, sized as
    ``envhub train`` sizes a run's (:func:`~envhub.trainer.cluster.run.ray_cpus`): room for
    ``vllm_max_full_weight_engines`` models at once, each its ranks and its vLLM engine, and a
    vLLM engine per served base model (a model beyond waits for room, then fails to place).

    Raises:
        ConfigError: The Megatron backend cannot run here (no GPUs), in the service's words.
    """
    from envhub.trainer.cluster.run import ray_cpus

    served = settings.served()
    try:
        per_model = ray_cpus(megatron_config(next(iter(served.values())), 0, settings))
    except ConfigError as e:  # in the run config's words (no GPUs, a split that does not fit)
        raise ConfigError(
            f"serve-trainer --backend megatron cannot start: {e} (the service's flag: "
            "--backend torch)"
        ) from e
    base_engines = len(served) if settings.sampler == "vllm" else 0
    return settings.vllm_max_full_weight_engines * per_model + base_engines


def start_ray(settings: ServiceSettings) -> bool:
    """Start the service's local Ray cluster (:func:`service_ray_cpus`), or join the one this
    process has; True when this call started it (the service then stops it:
    :func:`~envhub.trainer.cluster.run.stop_ray`)."""
    from envhub.trainer.cluster.ray_runtime import init_ray

    return init_ray(None, num_cpus=service_ray_cpus(settings))


@dataclass(frozen=True)
class DatumLosses:
    """A built-in Tinker loss over micro-batches of datums, as the ranks run it
    (:data:`~envhub.trainer.megatron.worker_steps.BatchLoss`): per micro-batch, the sum of
    its datums' losses; it reports each datum's per-token losses."""

    loss_fn: str
    config: dict[str, float | str]
    lengths: list[int]
    """Each datum's input tokens."""
    inputs: list[dict[str, torch.Tensor]]
    """Each datum's float ``loss_fn_inputs``."""
    rows: list[list[int]]
    """Each micro-batch's datums, row by row."""

    def __call__(self, k: int, logprobs: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Micro-batch ``k``'s summed loss from its logprobs ``[n, width - 1]``, and each of
        its datums' per-token losses (detached, on the CPU)."""
        loss_fn = get_loss(self.loss_fn)
        losses = []
        for row, i in enumerate(self.rows[k]):
            own = logprobs[row, : self.lengths[i]]
            inputs = {name: t.to(own.device) for name, t in self.inputs[i].items()}
            losses.append(loss_fn(own, inputs, self.config))
        total = torch.stack([loss.sum() for loss in losses]).sum()
        return total, [loss.detach().cpu() for loss in losses]


class MegatronTrainingModel:
    """A full-weight policy on Megatron ranks with the verbs of
    :class:`~envhub.trainer.service.training.TrainingModel` (see the module docstring).

    Args:
        model: A served model name (resolved by :func:`~envhub.trainer.models.resolve_model`).
        lora: Must be ``None``.
        seed: The ranks' seed.
        settings: The service's settings (the parallel split).
        name: The name clients know the base model by (``model`` when not given).

    Raises:
        ConfigError: A LoRA model, or a split that does not fit the model or the GPUs.
    """

    shared = None
    """No shared LoRA base (the samplers read it to find an adapter)."""
    adapter = None

    def __init__(self, model: str, lora: Any, seed: int, settings: ServiceSettings,
                 name: str | None = None) -> None:  # fmt: skip
        if lora is not None:
            raise ConfigError(LORA_REFUSED)
        self.name = name or model
        """The base model's name as clients send it."""
        self.lora = None
        self.backend = MegatronBackend(megatron_config(model, seed, settings))
        self.steps = 0
        """``optim_step`` calls applied."""

    def forward(self, request: ForwardRequest, custom: Any = None
                ) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:  # fmt: skip
        """Score ``request.data`` and, unless ``forward_only``, add the loss's gradients in the
        ranks; per datum ``logprobs`` and ``elementwise_loss``, and ``loss:sum``.

        Raises:
            ConfigError: A custom loss, ``[T, K]`` targets, an unknown loss, missing or
                misshapen ``loss_fn_inputs``.
        """
        if custom is not None:
            raise ConfigError(
                "custom losses run on the torch backend: start the service with --backend torch"
            )
        get_loss(request.loss_fn)  # an unknown name fails here, not in the ranks
        data = request.data
        if not data:
            raise ConfigError("forward_backward needs at least one datum")
        targets = [_flat_targets(d) for d in data]
        inputs = [loss_inputs(d, (len(d.tokens),)) for d in data]
        batches = self.backend.micro_batches(Batch(datum_samples(data, self.backend.pad_id)))
        loss = DatumLosses(request.loss_fn, request.loss_fn_config, [len(d.tokens) for d in data],
                           inputs, [mb.samples for mb in batches])  # fmt: skip
        reports = self.backend.forward_backward(
            batches, [_laid_out(mb, targets) for mb in batches], loss, request.forward_only
        )
        return _outputs(batches, reports, loss.lengths)

    def optim_step(self, adam: dict[str, float]) -> dict[str, float]:
        """Apply the pending gradients with Adam at ``adam``'s settings (those of
        ``TrainingModel.optim_step``); ``grad_norm`` (before clipping) and the
        ``learning_rate`` used."""
        norm = self.backend.optim_step(adam)
        self.steps += 1
        return {"grad_norm": norm, "learning_rate": adam["learning_rate"]}

    def save_state(self, folder: Path) -> None:
        """Write the ranks' model and optimizer shards into ``folder`` (megatron-core's
        distributed checkpoint)."""
        ShardedCheckpoint(self.backend.group).save_checkpoint(folder)

    def load_state(self, folder: Path, optimizer: bool) -> None:
        """Load the shards saved in ``folder``, the optimizer's with ``optimizer`` (else a fresh
        optimizer); pending gradients go.

        Raises:
            ConfigError: ``folder`` holds a torch backend's state.
        """
        if not (folder / WORKER_STATE).exists():
            raise ConfigError(
                f"the checkpoint in {folder.name!r} was saved by the torch backend: load it on a "
                "service started with --backend torch"
            )
        ShardedCheckpoint(self.backend.group).load_checkpoint(folder, optimizer)
        self.backend.group.call("discard_gradients")

    def export(self, folder: Path) -> Path:
        """Write the whole model and its tokenizer as an HF folder a sampler loads."""
        return self.backend.export(folder)

    def close(self) -> None:
        """Stop the model's ranks."""
        self.backend.close()


def _flat_targets(datum: Datum) -> torch.Tensor:
    """``datum``'s targets, one per input token.

    Raises:
        ConfigError: ``[T, K]`` targets, or as :func:`datum_targets`.
    """
    targets = datum_targets(datum)
    if targets.ndim != 1:
        raise ConfigError(
            "target_tokens of shape [T, K] are scored on the torch backend: start the service "
            "with --backend torch"
        )
    return targets


def _laid_out(mb: MicroBatch, targets: list[torch.Tensor]) -> torch.Tensor:
    """The targets of ``mb``'s datums as ``[n, width - 1]`` (0 past each datum's end)."""
    laid = torch.zeros(mb.loss_mask.shape, dtype=torch.long)
    for row, i in enumerate(mb.samples):
        laid[row, : len(targets[i])] = targets[i]
    return laid


def _outputs(batches: list[MicroBatch], reports: list[dict[str, Any]], lengths: list[int]
             ) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:  # fmt: skip
    """Per datum its ``logprobs`` and ``elementwise_loss`` (float32) from the ranks' reports,
    in the datums' order, and the summed loss."""
    outputs: list[dict[str, np.ndarray]] = [{} for _ in lengths]
    for mb, report in zip(batches, reports, strict=True):
        for row, i in enumerate(mb.samples):
            outputs[i]["logprobs"] = report["logprobs"][row, : lengths[i]].float().numpy()
            outputs[i]["elementwise_loss"] = report["loss"][row].float().numpy()
    total = sum(float(o["elementwise_loss"].sum()) for o in outputs)
    return outputs, {"loss:sum": total}
