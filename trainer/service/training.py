"""One training model of the service: envhub's torch backend driven by Tinker's verbs.

Tinker splits an update in two: ``forward_backward`` adds a batch's gradients (any number of
times) and ``optim_step`` applies them with the Adam parameters of that call. The backend's
own :meth:`~envhub.trainer.backends.torch_backend.TorchBackend.update` does both at once, so
here the backend lends its parts: the policy (LoRA through its ``model.lora``), its forward
(:func:`~envhub.trainer.backends.torch_backend.place_for` and ``placed_logits``: packed rows on
a CPU, the head on the scored places only), its AdamW and its export. Gradients accumulate in
the parameters' ``.grad`` between the two verbs, as in any torch loop.

A LoRA model is one adapter on a base model that other LoRA models share
(:mod:`~envhub.trainer.service.adapters`): each method first makes its adapter the active one,
and the model keeps its own AdamW over its adapter's tensors. A model that trains every weight
has a backend of its own.

Every method runs on the service's trainer thread, one at a time (``state.py``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from envhub.errors import ConfigError
from envhub.trainer.algorithms import selective_log_softmax
from envhub.trainer.backends.torch_backend import TorchBackend, place_for, placed_logits
from envhub.trainer.batch import Sample, collate
from envhub.trainer.config import validate_config
from envhub.trainer.service.adapters import SharedBase
from envhub.trainer.service.custom_losses import CustomLoss
from envhub.trainer.service.losses import get_loss
from envhub.trainer.service.wire import Datum, ForwardRequest


@dataclass(frozen=True)
class LoraSpec:
    """A LoRA adapter as a client asks for it (``LoraConfig`` of the SDK)."""

    rank: int
    train_attn: bool = True
    train_mlp: bool = True

    def target_modules(self) -> list[str] | str:
        """PEFT's ``target_modules``: every linear layer, or the attention's / the MLP's
        (Llama-family names). The unembedding is never adapted (its weight is tied to the
        embedding in the small models served on a CPU)."""
        if self.train_attn and self.train_mlp:
            return "all-linear"
        attention = ["q_proj", "k_proj", "v_proj", "o_proj"]
        mlp = ["gate_proj", "up_proj", "down_proj"]
        return (attention if self.train_attn else []) + (mlp if self.train_mlp else [])


def backend_config(model: str, lora: LoraSpec | None, device: str) -> Any:
    """The ``TrainConfig`` whose torch backend the service drives: logprobs at temperature 1,
    no gradient clipping of its own (each ``optim_step`` says), no schedule."""
    return validate_config({
        "model": {"name": model, "dtype": "float32",
                  "lora": None if lora is None else {
                      "rank": lora.rank, "target_modules": lora.target_modules()}},
        "envs": [{"name": "arithmetic"}],  # a TrainConfig needs one; nothing rolls out here
        "rollout": {"temperature": 1.0},
        "optimizer": {"grad_clip": None},
        "backend": {"device": device},
    })  # fmt: skip


def shared_base(model: str, lora: LoraSpec, seed: int, device: str) -> SharedBase:
    """A base model for LoRA adapters, its first adapter shaped as ``lora`` and seeded with
    ``seed`` (claimed by the first :class:`TrainingModel` on it)."""
    torch.manual_seed(seed)
    return SharedBase(TorchBackend(backend_config(model, lora, device)))


class TrainingModel:
    """A policy with its optimizer, trained by ``forward_backward`` and ``optim_step``.

    Args:
        model: A served model name (resolved by :func:`~envhub.trainer.models.resolve_model`).
        lora: The adapter to train, or ``None`` for every weight.
        seed: Seeds torch before the model is built (the LoRA adapter's initialisation).
        device: ``cpu``, ``cuda`` or ``auto``.
        name: The name clients know the base model by (``model`` when not given).
        base: With ``lora``, the base model to add the adapter to (a new one when ``None``).
    """

    def __init__(self, model: str, lora: LoraSpec | None, seed: int, device: str,
                 name: str | None = None, base: SharedBase | None = None) -> None:  # fmt: skip
        self.name = name or model
        """The base model's name as clients send it."""
        self.lora = lora
        self.shared: SharedBase | None = None
        """The base this model's adapter is on (``None`` when it trains every weight)."""
        self.adapter: str | None = None
        if lora is None:
            torch.manual_seed(seed)
            self.backend = TorchBackend(backend_config(model, None, device))
            self.optimizer = self.backend.optimizer
        else:
            self.shared = base or shared_base(model, lora, seed, device)
            self.backend = self.shared.backend
            self.adapter = self.shared.add(lora, seed)
            self.optimizer = torch.optim.AdamW([p for _, p in self._trained()])
        self.steps = 0
        """``optim_step`` calls applied."""

    def _use(self) -> None:
        """Make this model's adapter the one the shared base runs and trains."""
        if self.shared is not None:
            self.shared.use(self.adapter)

    def forward(self, request: ForwardRequest, custom: CustomLoss | None = None
                ) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:  # fmt: skip
        """Score ``request.data`` and, unless ``forward_only``, add the loss's gradients.

        Args:
            request: The decoded request.
            custom: The uploaded loss to run instead of the built-in ``request.loss_fn``.

        Returns:
            Per datum ``logprobs`` and, with a built-in loss, ``elementwise_loss`` (float32,
            one per target token); and the metrics: the summed loss (``loss:sum``) and a
            custom loss's own.

        Raises:
            ConfigError: An unknown loss, missing or misshapen ``loss_fn_inputs``.
        """
        loss = _builtin(request) if custom is None else _uploaded(custom)
        data = request.data
        if not data:
            raise ConfigError("forward_backward needs at least one datum")
        targets = [datum_targets(d) for d in data]
        self._use()
        model = self.backend.model
        backward = not request.forward_only
        model.train(backward)
        grad = torch.enable_grad() if backward else torch.no_grad()
        with grad:
            logprobs = self._logprobs(data, targets)
            total, elementwise, metrics = loss(logprobs, data)
            if backward:
                total.backward()
        outputs = [{"logprobs": lp.detach().numpy()} for lp in logprobs]
        for output, per_token in zip(outputs, elementwise or [], strict=False):
            output["elementwise_loss"] = per_token
        return outputs, {"loss:sum": float(total.detach()), **metrics}

    def optim_step(self, adam: dict[str, float]) -> dict[str, float]:
        """Apply the accumulated gradients with the backend's AdamW at ``adam``'s settings
        (``learning_rate``, ``beta1``, ``beta2``, ``eps``, ``weight_decay``, and
        ``grad_clip_norm``: 0 for none), then clear them.

        Returns:
            ``grad_norm`` (before clipping) and the ``learning_rate`` used.
        """
        self._use()
        optimizer = self.optimizer
        for group in optimizer.param_groups:
            group["lr"] = adam["learning_rate"]
            group["betas"] = (adam["beta1"], adam["beta2"])
            group["eps"] = adam["eps"]
            group["weight_decay"] = adam["weight_decay"]
        params = [p for _, p in self._trained() if p.grad is not None]
        limit = adam["grad_clip_norm"] or math.inf
        norm = float(torch.nn.utils.clip_grad_norm_(params, limit)) if params else 0.0
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        return {"grad_norm": norm, "learning_rate": adam["learning_rate"]}

    def save_state(self, folder: Path) -> None:
        """Write the training state into ``folder``: the trained tensors by name
        (``trainable.safetensors``: the adapter's with LoRA) and AdamW's state
        (``optimizer.pt``), which :meth:`load_state` restores."""
        from safetensors.torch import save_file

        self._use()
        tensors = {n: p.detach().cpu().contiguous() for n, p in self._trained()}
        save_file(tensors, str(folder / "trainable.safetensors"))
        torch.save(self.optimizer.state_dict(), folder / "optimizer.pt")

    def load_state(self, folder: Path, optimizer: bool) -> None:
        """Restore the trained tensors saved in ``folder`` and, with ``optimizer``, AdamW's
        state; without it the optimizer starts afresh (no moments). Pending gradients go.

        Raises:
            ConfigError: The checkpoint's tensors are not this model's (another base model or
                LoRA shape).
        """
        from safetensors.torch import load_file

        saved = load_file(str(folder / "trainable.safetensors"))
        self._use()
        params = dict(self._trained())
        if set(saved) != set(params) or any(saved[n].shape != p.shape for n, p in params.items()):
            raise ConfigError(f"the checkpoint in {folder.name!r} does not fit this model")
        with torch.no_grad():
            for name, param in params.items():
                param.copy_(saved[name])
        opt = self.optimizer
        opt.zero_grad(set_to_none=True)
        if optimizer:
            opt.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True))
        else:
            opt.state.clear()

    def _trained(self) -> list[tuple[str, torch.nn.Parameter]]:
        """The tensors this model trains, by the names a saved state gives them."""
        if self.shared is not None:
            return self.shared.parameters(self.adapter)
        return [(n, p) for n, p in self.backend.model.named_parameters() if p.requires_grad]

    def close(self) -> None:
        """Nothing to stop: its tensors go with it (a Megatron model stops its ranks)."""

    def export(self, folder: Path) -> Path:
        """Write the weights (this model's adapter merged, tensor by tensor: the shared base is
        not touched) and tokenizer as an HF folder a sampler loads."""
        if self.shared is None:
            return self.backend.export(folder)
        from envhub.trainer.backends.torch_backend import hf_weights
        from envhub.trainer.checkpoint.export import export_hf_weights

        self._use()
        with torch.no_grad():
            weights = {name: t.cpu() for name, t in hf_weights(self.backend.model)}
        return export_hf_weights(weights, self.backend.model_path, folder)

    def _logprobs(self, data: list[Datum], targets: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each datum's logprob of its target at every input position, in one forward.

        A datum becomes one sequence of the backend's micro-batch: its input tokens plus a
        placeholder last token (causal attention: it changes no earlier position), with every
        position scored; the logits are then read at the datum's own ``target_tokens``, which
        need not be the next input tokens.
        """
        backend = self.backend
        samples = datum_samples(data, backend.pad_id)
        mb = collate(samples, list(range(len(samples))), backend.pad_id)
        placed = place_for(backend.model, mb, backend.packed)
        with _autocast(backend):
            logits = placed_logits(backend.model, placed).float()
        lengths = [len(d.tokens) for d in data]
        if placed.targets is not None:  # [N, V], the places row by row
            rows = torch.split(logits, lengths)
        else:  # [n, width - 1, V]
            rows = tuple(logits[i, :n] for i, n in enumerate(lengths))
        return [_pick(row, t.to(row.device)).cpu() for row, t in zip(rows, targets, strict=True)]


def datum_samples(data: list[Datum], pad_id: int) -> list[Sample]:
    """Each datum as a backend's sequence: its input tokens plus a placeholder last token
    (``pad_id``; causal attention: it changes no earlier position), every input position
    scored, numbered by its place in ``data``."""
    return [
        Sample(d.tokens + [pad_id], [0] + [1] * len(d.tokens), [0.0] * (len(d.tokens) + 1),
               0.0, i)
        for i, d in enumerate(data)
    ]  # fmt: skip


def _pick(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits)`` at ``targets``: ``(T,)`` for one target per position, ``(T, K)``
    for ``K`` (a distribution's support, as custom losses may read)."""
    if targets.ndim == 1:
        return selective_log_softmax(logits[None], targets[None])[0]
    chosen = logits.gather(-1, targets)
    return chosen - torch.logsumexp(logits, dim=-1, keepdim=True)


BatchLoss = Callable[[list[torch.Tensor], list[Datum]],
                     tuple[torch.Tensor, list[np.ndarray] | None, dict[str, float]]]  # fmt: skip
"""A loss over a batch: ``(logprobs, data) -> (summed loss, per datum per-token losses or
None, metrics)``."""


def _builtin(request: ForwardRequest) -> BatchLoss:
    """``request``'s built-in loss, per token."""
    loss_fn = get_loss(request.loss_fn)

    def run(logprobs: list[torch.Tensor], data: list[Datum]) -> Any:
        losses = [loss_fn(lp, loss_inputs(d, tuple(lp.shape)), request.loss_fn_config)
                  for d, lp in zip(data, logprobs, strict=True)]  # fmt: skip
        total = torch.stack([loss.sum() for loss in losses]).sum()
        return total, [loss.detach().numpy() for loss in losses], {}

    return run


def _uploaded(custom: CustomLoss) -> BatchLoss:
    """An uploaded loss, per datum (no per-token losses)."""

    def run(logprobs: list[torch.Tensor], data: list[Datum]) -> Any:
        total, metrics = custom.apply(logprobs, data)
        return total, None, metrics

    return run


def datum_targets(datum: Datum) -> torch.Tensor:
    """``datum``'s ``target_tokens`` as int64: ``(T,)``, or ``(T, K)`` for ``K`` each.

    Raises:
        ConfigError: None given, or not one row per input token.
    """
    target = datum.inputs.get("target_tokens")
    if target is None:
        raise ConfigError("every datum needs loss_fn_inputs['target_tokens']")
    if target.ndim not in (1, 2) or target.shape[0] != len(datum.tokens):
        raise ConfigError(
            f"target_tokens has shape {tuple(target.shape)}; the model input has "
            f"{len(datum.tokens)} tokens (one target per input position, or [T, K] for K each)"
        )
    return torch.from_numpy(target.astype(np.int64))


def loss_inputs(datum: Datum, shape: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """The datum's float ``loss_fn_inputs`` as tensors, each checked to have its logprobs'
    ``shape``.

    Raises:
        ConfigError: An input of another shape.
    """
    out = {}
    for name, array in datum.inputs.items():
        if name == "target_tokens":
            continue
        if array.shape != shape:
            raise ConfigError(
                f"loss_fn_inputs[{name!r}] has shape {array.shape}; "
                f"expected {shape}"
            )
        out[name] = torch.from_numpy(array.astype(np.float32))
    return out


def _autocast(backend: TorchBackend) -> contextlib.AbstractContextManager[Any]:
    if backend.autocast_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=backend.device.type, dtype=backend.autocast_dtype)
