"""The torch critic: an HF token-classification model with one output, in the trainer's process.

``AutoModelForTokenClassification(num_labels=1)`` is the critic verl and OpenRLHF train for
PPO: the policy's transformer (or another model's) with a linear value head on every position
instead of the vocabulary head. Loaded from the policy's folder it starts from the policy's
weights (a copy: the two never share a tensor) with a new head initialised to zero
(:func:`zero_value_head`); loaded from a saved critic it keeps that critic's head. It lives on
the policy's device, in float32 with the same autocast, and is checkpointed as an HF folder
(``critic/model``), so it can be loaded on its own afterwards.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from typing import Any

import torch

from envhub.errors import ConfigError
from envhub.trainer.algorithms import clipped_value_loss
from envhub.trainer.batch import Sample, pack
from envhub.trainer.config import TrainConfig
from envhub.trainer.critic.targets import stack_targets, value_places
from envhub.trainer.estimate import device_memory, micro_batch_tokens
from envhub.trainer.models import resolve_model


class TorchCritic:
    """The value model of ``algorithm.advantage: gae`` on the torch backend.

    Args:
        config: The run; ``critic`` holds the critic's own settings.
        device: Where the policy trains (the critic goes there too).
        autocast_dtype: The policy's autocast dtype (``None``: plain float32).
    """

    def __init__(
        self, config: TrainConfig, device: torch.device, autocast_dtype: torch.dtype | None
    ) -> None:
        self.settings = config.critic
        self.device = device
        self.autocast_dtype = autocast_dtype
        self.budget = self.settings.micro_batch_tokens or micro_batch_tokens(
            config, device_memory(torch.device(device))
        )
        self.model_path = resolve_model(self.settings.model or config.model.name)
        self.model = _load_value_model(self.model_path, device)
        if config.model.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        self.pad_id = self.model.config.pad_token_id or 0
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=self.settings.lr,
            betas=config.optimizer.betas,
            weight_decay=self.settings.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda _: 1.0)

    @torch.no_grad()
    def values(self, sequences: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """The value of every place of each sequence: ``(L - 1,)`` float64 per sequence, place
        ``t`` the state after tokens ``0..t`` (before token ``t + 1`` was sampled)."""
        was_training = self.model.training
        self.model.eval()
        out: list[torch.Tensor | None] = [None] * len(sequences)
        try:
            for indices in pack([len(s) for s in sequences], self.budget):
                ids, attention = _pad([sequences[i] for i in indices], self.pad_id, self.device)
                values = self._forward(ids, attention).double().cpu()
                for row, i in enumerate(indices):
                    out[i] = values[row, : len(sequences[i]) - 1]
        finally:
            self.model.train(was_training)
        return [v for v in out if v is not None]

    def update(self, samples: Sequence[Sample]) -> dict[str, float]:
        """One optimizer update of the critic on ``samples``' value targets (gradient
        accumulation over micro-batches, the loss normalised by the whole update's count of
        value places). Returns ``value_loss``, ``value_clip_frac``, ``value_error`` (mean
        squared error before the update), ``grad_norm`` and ``lr``."""
        num_places = value_places(samples)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        totals = {"loss": 0.0, "clip_frac": 0.0, "error": 0.0}
        for indices in pack([len(s) for s in samples], self.budget):
            batch = [samples[i] for i in indices]
            ids, attention = _pad([s.token_ids for s in batch], self.pad_id, self.device)
            old, returns, mask = stack_targets([s.value_target for s in batch], ids.shape[1] - 1)
            loss, metrics = clipped_value_loss(
                self._forward(ids, attention),
                old.to(self.device),
                returns.to(self.device),
                mask.to(self.device),
                clip=self.settings.value_clip,
                num_tokens=num_places,
            )
            loss.backward()
            weight = float(mask.sum()) / max(num_places, 1)
            totals["loss"] += float(loss.detach())
            totals["clip_frac"] += float(metrics["clip_frac"]) * weight
            totals["error"] += float(metrics["error"]) * weight
        grad_norm = self._clip_gradients()
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        return {
            "value_loss": totals["loss"],
            "value_clip_frac": totals["clip_frac"],
            "value_error": totals["error"],
            "grad_norm": grad_norm,
            "lr": lr,
        }

    def state(self) -> dict[str, Any]:
        """What a checkpoint saves of the critic: ``model``, ``optimizer``, ``scheduler``."""
        return {"model": self.model, "optimizer": self.optimizer, "scheduler": self.scheduler}

    def close(self) -> None:
        """Nothing to release: the critic lives in this process."""

    def _forward(self, ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        """``[n, width - 1]`` float32 values of the places that have a next token."""
        autocast = (
            torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)
            if self.autocast_dtype is not None
            else contextlib.nullcontext()
        )
        with autocast:
            logits = self.model(input_ids=ids, attention_mask=attention, use_cache=False).logits
        return logits[:, :-1, 0].float()

    def _clip_gradients(self) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        if not params:
            return 0.0
        limit = self.settings.grad_clip
        return float(
            torch.nn.utils.clip_grad_norm_(params, limit if limit is not None else math.inf)
        )


def _load_value_model(path: str, device: torch.device) -> torch.nn.Module:
    """The token-classification model with one label at ``path``, float32 on ``device``."""
    from transformers import AutoConfig, AutoModelForTokenClassification
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "newly initialized: score.weight" is expected
    try:
        config = AutoConfig.from_pretrained(path, num_labels=1)
        # No dropout on the values (transformers' head has 0.1 unless the config says):
        # PPO's critic regresses its targets, it is not a classifier to regularise.
        config.classifier_dropout = 0.0
        model, loading = AutoModelForTokenClassification.from_pretrained(
            path, config=config, dtype=torch.float32, output_loading_info=True
        )
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"cannot load critic model {path!r} as a token classifier: {e}. Set critic.model to "
            "an HF causal LM whose architecture has a ...ForTokenClassification class "
            "(Llama, Qwen2, Qwen3, Mistral, ...)"
        ) from None
    finally:
        hf_logging.set_verbosity(level)
    if any(key.startswith("score.") for key in loading["missing_keys"]):
        zero_value_head(model.score)
    return model.to(device)


@torch.no_grad()
def zero_value_head(head: torch.nn.Linear) -> None:
    """A new value head starts at zero (both backends do this): every value is 0 until the
    critic has learned, so the first advantages are the returns themselves (REINFORCE), and the
    start is the same on every rank and backend."""
    head.weight.zero_()
    if head.bias is not None:
        head.bias.zero_()


def _pad(
    sequences: Sequence[Sequence[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``[n, width]`` ids and attention mask."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, s in enumerate(sequences):
        ids[row, : len(s)] = torch.tensor(list(s))
        attention[row, : len(s)] = 1
    return ids.to(device), attention.to(device)
