"""The torch backend: one process, an HF transformers causal LM on the CPU or one GPU.

Parameters and optimizer state stay in float32 (the master copy); on a GPU the forward pass
runs under bfloat16 autocast when ``model.dtype`` is ``auto`` or ``bfloat16``. Micro-batches are
accumulated into one optimizer update; the loss of each is normalised by the whole update's
token/sequence totals, so the gradient is the same however the update is split.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from envhub.errors import ConfigError
from envhub.trainer.algorithms import (
    ObjectiveSpec,
    policy_objective,
    selective_log_softmax,
    token_entropy,
)
from envhub.trainer.backends import compiled_layers, packed_attention
from envhub.trainer.backends.base import StepResult
from envhub.trainer.backends.fused_logprobs import fused_logprobs
from envhub.trainer.backends.hf_model import (
    PLAIN_HEAD,
    autocast_dtype,
    decoder_layers,
    load_model,
    packs,
)
from envhub.trainer.backends.placement import Placed, Targets, place
from envhub.trainer.batch import Batch, MicroBatch, micro_batches
from envhub.trainer.config import TrainConfig
from envhub.trainer.config.backend import resolve_switch
from envhub.trainer.estimate import device_memory, micro_batch_tokens
from envhub.trainer.models import resolve_model

if TYPE_CHECKING:
    from envhub.trainer.weight_sync import TransferPlan

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    """``auto`` -> the first CUDA GPU when there is one, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"backend.device={name} but torch sees no CUDA GPU; use backend.device=cpu"
        )
    return device


class TorchBackend:
    """Trains an HF causal LM in this process (see the module docstring)."""

    def __init__(self, config: TrainConfig) -> None:
        self.config = config
        if config.backend.threads:
            torch.set_num_threads(config.backend.threads)
        self.device = resolve_device(config.backend.device)
        self.autocast_dtype = autocast_dtype(config.model.dtype, self.device)
        self.temperature = config.rollout.temperature
        self.model_path = resolve_model(config.model.name)
        self.tokenizer, self._model = load_model(self.model_path, config, self.device)
        self.packed = packs(self._model, config, self.device)
        """Micro-batches run packed into one row each (``backend.packing``), not padded."""
        self.micro_batch_tokens = micro_batch_tokens(config, device_memory(self.device))
        """``backend.micro_batch_tokens``, ``auto`` resolved for this device."""
        on_cuda = self.device.type == "cuda"
        compile = config.backend.compile
        self.fused = resolve_switch(compile.logprobs, "compile.logprobs", on_cuda)
        """The trained tokens' logprobs and entropy metric run compiled (``fused_logprobs``)."""
        self.compiled_layers = resolve_switch(compile.layers, "compile.layers", on_cuda)
        """The decoder layers run compiled; micro-batch lengths are bucketed."""
        if self.compiled_layers:
            compiled_layers.compile_layers(decoder_layers(self._model))
        self._compile_time = compiled_layers.CompileTime(log)
        log.info(
            "micro-batches of <= %d tokens, %s; compiled logprobs %s, layers %s",
            self.micro_batch_tokens, "packed" if self.packed else "padded",
            self.fused, self.compiled_layers,
        )  # fmt: skip
        self.reference = (
            load_model(self.model_path, config, self.device, frozen=True)[1]
            if config.algorithm.needs_reference
            else None
        )
        trainable = [p for p in self._model.parameters() if p.requires_grad]
        opt = config.optimizer
        self.optimizer = torch.optim.AdamW(
            trainable, lr=opt.lr, betas=opt.betas, weight_decay=opt.weight_decay
        )
        total_updates = config.steps * config.algorithm.updates_per_step
        multiplier = lr_multiplier(
            opt.schedule, opt.warmup_steps, total_updates, config.sft_steps, config.sft_lr_scale
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, multiplier)

    @property
    def model(self) -> torch.nn.Module:
        """The policy module being trained (a ``PeftModel`` when LoRA is on)."""
        return self._model

    @property
    def pad_id(self) -> int:
        """The tokenizer's pad token id, or its EOS id when it defines no pad token."""
        pad = self.tokenizer.pad_token_id
        return pad if pad is not None else self.tokenizer.eos_token_id

    def num_parameters(self, trainable_only: bool = False) -> int:
        """Count the policy's parameters (elements, not tensors).

        Args:
            trainable_only: Count only parameters that require gradients (the LoRA adapters
                when LoRA is on).

        Returns:
            The number of parameter elements.
        """
        return sum(
            p.numel() for p in self._model.parameters() if p.requires_grad or not trainable_only
        )

    # -- the operations the loop needs ----------------------------------------------------------

    def micro_batches(self, batch: Batch) -> list[MicroBatch]:
        """Micro-batches of at most ``backend.micro_batch_tokens`` tokens: the tokens of its row
        when the model runs each one packed (a shared prompt counted once, the samples of a
        prompt kept together), padded ones when it runs a padded ``[n, width]`` batch
        (:attr:`packed`)."""
        return micro_batches(
            batch,
            self.micro_batch_tokens,
            self.pad_id,
            packed=self.packed,
            shared_prompts=self.packed,
        )

    @torch.no_grad()
    def logprobs(
        self, batches: list[MicroBatch], reference: bool = False, temperature: float | None = None
    ) -> list[torch.Tensor]:
        """Per-target-token logprobs of each micro-batch, without gradients, on the CPU.

        The model is put in eval mode for the pass and restored afterwards.

        Args:
            batches: The micro-batches to score (moved to this backend's device one at a time).
            reference: Score under the frozen reference model instead of the policy.
            temperature: Divide the logits by this; the rollout temperature when ``None``.

        Returns:
            One ``[n, width - 1]`` tensor per micro-batch, aligned with its ``loss_mask``.

        Raises:
            ConfigError: ``reference`` is set but no reference model was loaded
                (``algorithm.kl_beta`` is 0).
        """
        model = self.reference if reference else self._model
        if model is None:
            raise ConfigError(
                "reference logprobs need a reference model (set algorithm.kl_beta > 0)"
            )
        was_training = model.training
        model.eval()
        try:
            scored = [self._token_logprobs(model, mb, temperature=temperature)[0] for mb in batches]
            return [logprobs.cpu() for logprobs in scored]  # one wait, after every forward
        finally:
            model.train(was_training)

    @torch.no_grad()
    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy's weights under HF names, LoRA merged, one tensor at a time (see
        :func:`hf_weights`)."""
        return hf_weights(self._model)

    def save_adapter(self, target: Path) -> int:
        """Write the policy's LoRA adapter alone (PEFT's format: ``adapter_config.json`` and
        ``adapter_model.safetensors``) to the folder ``target``; return its size in bytes.

        Raises:
            ConfigError: The policy has no LoRA adapter (``model.lora`` is not set).
        """
        if not hasattr(self._model, "peft_config"):
            raise ConfigError("the policy has no LoRA adapter to save: set model.lora")
        self._model.save_pretrained(str(target))
        return sum(f.stat().st_size for f in Path(target).iterdir() if f.is_file())

    def weight_sender(self, plan: TransferPlan) -> None:
        """None: the weights live in this process, which sends them."""
        return None

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
        """One optimizer update: accumulate the gradients of every micro-batch, clip, step.

        Each micro-batch's loss is normalised by the whole update's ``num_tokens`` /
        ``num_sequences``, so the summed gradient does not depend on how the update was split.
        The scheduler advances once per update.

        Returns:
            The summed loss, the other metrics as means weighted by each micro-batch's token
            count, ``grad_norm`` (before clipping) and the ``lr`` the step used; and the
            logprobs the loss saw.
        """
        self._model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, torch.Tensor] = {}  # on the device: read once, after the last backward
        weight_sum = 0
        seen: list[torch.Tensor] = []
        # The host's part of every micro-batch first: the device then runs them back to back.
        prepared = [self._place(mb) for mb in batches]
        for k, (placed, loss_inputs, weight) in enumerate(prepared):
            logprobs, entropy = self._scores(self._model, placed, with_entropy=True)
            seen.append(logprobs.detach())
            loss, metrics = policy_objective(
                spec,
                logprobs=logprobs,
                old_logprobs=old_logprobs[k].to(self.device) if old_logprobs else None,
                advantages=loss_inputs.advantages,
                mask=loss_inputs.loss_mask,
                num_tokens=num_tokens,
                num_sequences=num_sequences,
                sampler_logprobs=loss_inputs.sampler_logprobs,
                ref_logprobs=ref_logprobs[k].to(self.device) if ref_logprobs else None,
                entropy=entropy,
                supervised=loss_inputs.supervised,
            )
            loss.backward()
            weight_sum += weight
            _accumulate(sums, "loss", loss.detach())
            for name, value in metrics.items():
                # float64 before the weight, as the Python floats these sums replace were
                _accumulate(
                    sums, name, torch.as_tensor(value, device=self.device).double() * weight
                )
        values = dict(zip(sums, torch.stack(list(sums.values())).tolist(), strict=True))
        metrics = {
            name: (v if name == "loss" else v / max(weight_sum, 1)) for name, v in values.items()
        }
        metrics["grad_norm"] = self._clip_gradients()
        metrics["lr"] = self.scheduler.get_last_lr()[0]
        if self.fused or self.compiled_layers:
            metrics["compile_s"] = self._compile_time.report()
        self.optimizer.step()
        self.scheduler.step()
        return StepResult(metrics, token_logprobs=[logprobs.cpu() for logprobs in seen])

    # -- checkpoints and export -----------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The objects a checkpoint saves: model, optimizer, scheduler and tokenizer."""
        return {
            "model": self._model,
            "optimizer": self.optimizer,
            "scheduler": self.scheduler,
            "tokenizer": self.tokenizer,
        }

    def export(self, target: Path) -> Path:
        """Write the policy (LoRA merged) and tokenizer as an HF folder at ``target``; return it."""
        from envhub.trainer.checkpoint import export_hf

        return export_hf(self._model, self.tokenizer, target)

    def describe(self) -> str:
        """The device the policy trains on (``cpu``, ``cuda:0``)."""
        return str(self.device)

    def close(self) -> None:
        """Nothing to release: the model lives in this process."""

    # -- internals ------------------------------------------------------------------------------

    def _token_logprobs(
        self,
        model: torch.nn.Module,
        mb: MicroBatch,
        with_entropy: bool = False,
        temperature: float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logprob of each target token under ``logits / temperature`` (the distribution the
        engine sampled from), and optionally the entropy of that distribution.

        Both are ``[n, width - 1]``, like ``mb.loss_mask``. For models whose head is a plain
        projection (:data:`PLAIN_HEAD`) the head and the softmax run only where the loss mask
        is 1 and the other places are 0: prompts and tool results cost no vocabulary-sized
        logits. Other models score every place. ``mb`` is the host copy (see
        :func:`target_logits`); the results are on this backend's device.
        """
        placed = place_for(model, mb, self.packed, bucket=self.compiled_layers)
        return self._scores(model, placed, with_entropy, temperature)

    def _place(self, mb: MicroBatch) -> tuple[Placed, MicroBatch, int]:
        """The host's part of a micro-batch for :meth:`update`: its forward's layout, its loss
        inputs moved to the device, and its count of trained tokens."""
        placed = place_for(self._model, mb, self.packed, bucket=self.compiled_layers)
        return placed, mb.to(self.device), mb.num_tokens

    def _scores(
        self,
        model: torch.nn.Module,
        placed: Placed,
        with_entropy: bool = False,
        temperature: float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`_token_logprobs` of a micro-batch already placed: device work only."""
        with self._autocast():
            logits = placed_logits(model, placed)
        targets = placed.targets
        # The fused pass's entropy is a metric: an entropy loss term takes the eager path.
        if self.fused and not (with_entropy and self.config.algorithm.entropy_coef):
            logprobs, entropy = fused_logprobs(
                logits, placed.tokens, temperature or self.temperature
            )
            if targets is not None:
                logprobs, entropy = targets.spread(logprobs), targets.spread(entropy)
            return logprobs, entropy if with_entropy else None
        logits = logits.float() / (temperature or self.temperature)
        logprobs = selective_log_softmax(logits[None], placed.tokens[None])[0]
        if targets is not None:  # [N] at the N trained targets
            logprobs = targets.spread(logprobs)
        entropy = None
        if with_entropy:  # a metric always; a loss term only when entropy_coef != 0
            source = logits if self.config.algorithm.entropy_coef else logits.detach()
            entropy = token_entropy(source[None])[0]
            if targets is not None:
                entropy = targets.spread(entropy)
        return logprobs, entropy

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def _clip_gradients(self) -> float:
        params = [p for p in self._model.parameters() if p.grad is not None]
        if not params:
            return 0.0
        limit = self.config.optimizer.grad_clip
        norm = torch.nn.utils.clip_grad_norm_(params, limit if limit is not None else math.inf)
        return float(norm)


def _accumulate(sums: dict[str, torch.Tensor], name: str, value: torch.Tensor) -> None:
    """Add ``value`` (a 0-d device tensor) to ``sums[name]`` without reading it back."""
    value = value.detach().double()  # float64 sums, as the Python floats they replace
    sums[name] = sums[name] + value if name in sums else value


def target_logits(
    model: torch.nn.Module, mb: MicroBatch, packed: bool = False
) -> tuple[torch.Tensor, Targets | None]:
    """The logits that score ``mb``'s targets (position ``t`` scores token ``t + 1``).

    Returns ``(logits [N, V], targets)`` with ``targets`` the :class:`Targets` (the ``N``
    places the loss uses), when the model's head is plain (:data:`PLAIN_HEAD`); else
    ``(logits [n, width - 1, V], None)`` from the whole model, whose places past a sequence's
    end hold no score of it. With ``packed`` the model runs the sequences end to end in one row,
    shared prompts once (:class:`packed_attention.PackedRow`; the model's attention must be
    :mod:`packed_attention`'s); the logits come back in the same layout either way.
    ``mb`` is the host copy (see :func:`placement.place`).
    """
    placed = place_for(model, mb, packed)
    return placed_logits(model, placed), placed.targets


def place_for(model: torch.nn.Module, mb: MicroBatch, packed: bool, bucket: bool = False) -> Placed:
    """:func:`placement.place` for ``model``: on its device, the head on the trained places
    only for a plain head (:data:`PLAIN_HEAD`); with ``bucket`` its length padded to
    :func:`compiled_layers.bucket_length` (for compiled layers).

    Raises:
        ConfigError: ``packed`` for a model whose attention is not :mod:`packed_attention`'s.
    """
    if packed and getattr(model.config, "_attn_implementation", None) != packed_attention.NAME:
        # Any other attention would ignore the segments and attend across the whole row.
        raise ConfigError("a packed micro-batch needs the model's attention to be packed_sdpa")
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    attention = getattr(config, "_attn_implementation", None)
    return place(
        mb,
        next(model.parameters()).device,
        packed=packed,
        head_on_targets=model_type in PLAIN_HEAD,
        sdpa_mask=attention in ("sdpa", packed_attention.NAME),
        bucket=bucket,
    )


def placed_logits(model: torch.nn.Module, placed: Placed) -> torch.Tensor:
    """The logits at ``placed``'s targets: ``[N, V]`` with :attr:`Placed.targets`, the
    vocabulary head run on those places only; else ``[n, width - 1, V]`` from the whole model."""
    if placed.targets is None:
        return model(**placed.inputs, use_cache=False).logits[placed.states]
    hidden = model.get_decoder()(**placed.inputs, use_cache=False).last_hidden_state
    return model.get_output_embeddings()(hidden[placed.states])


def hf_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``model``'s weights under their HF checkpoint names, tied ones once. For a LoRA
    ``PeftModel`` each adapted weight is yielded merged (base + scaled ``B @ A``), computed per
    tensor, so the live model is never modified."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    for name, parameter in base.named_parameters():
        if ".lora_" in name:
            continue
        module_name, _, leaf = name.rpartition(".")
        if module_name.endswith(".base_layer"):
            adapted = base.get_submodule(module_name.removesuffix(".base_layer"))
            tensor = parameter.detach()
            if leaf == "weight" and not getattr(adapted, "merged", False):
                for adapter in adapted.active_adapters:
                    if adapter in adapted.lora_A:
                        tensor = tensor + adapted.get_delta_weight(adapter).to(tensor.dtype)
            yield name.replace(".base_layer.", "."), tensor
        else:
            yield name, parameter.detach()


def lr_multiplier(
    kind: str, warmup: int, total: int, sft_updates: int = 0, sft_scale: float = 1.0
) -> Any:
    """LR multiplier per update: linear warm-up, then constant, linear or cosine decay to 0
    over ``total`` RL updates (shared with the Megatron backend, which must follow the same
    schedule). A warm start's ``sft_updates`` supervised updates come first, at ``sft_scale``
    (``sft.lr / optimizer.lr``), and the schedule starts after them."""

    def multiplier(update: int) -> float:
        if update < sft_updates:
            return sft_scale
        update -= sft_updates
        if warmup and update < warmup:
            return (update + 1) / warmup
        if kind == "constant" or total <= warmup:
            return 1.0
        progress = min(1.0, (update - warmup) / max(1, total - warmup))
        return 1.0 - progress if kind == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))

    return multiplier
