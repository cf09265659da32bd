"""Model and optimizer state: what goes into a checkpoint's ``model/`` folder and ``*.pt`` files.

Three kinds of model are saved and loaded here:

- a transformers ``PreTrainedModel``: ``save_pretrained`` safetensors, loaded back in place;
- a ``peft.PeftModel``: only its LoRA adapter and ``adapter_config.json``;
- a :class:`ShardedModel`, which saves and loads itself (the Megatron backend's shards).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from envhub.errors import CheckpointError
from envhub.trainer.checkpoint.manifest import WHAT_TO_DO

_SAME_SETTINGS = "resume with the model, LoRA and optimizer settings it was saved with"


@runtime_checkable
class ShardedModel(Protocol):
    """A model spread over ranks that writes and reads its own checkpoint, optimizer included.

    :class:`~envhub.trainer.checkpoint.CheckpointManager` hands such a model the checkpoint's
    ``model/`` folder instead of calling ``save_pretrained``, and then saves no ``optimizer.pt``
    (pass ``optimizer=None``): the shards hold the optimizer state. The Megatron backend's
    ``ShardedCheckpoint`` is one. Any object with these two methods qualifies; there is nothing
    to inherit.
    """

    def save_checkpoint(self, folder: Path) -> None:
        """Write every rank's part of the model and optimizer state under ``folder``.

        Args:
            folder: The checkpoint's ``model/`` folder inside the staging folder (it may not
                exist yet); it must be on storage that every rank can write.
        """
        ...

    def load_checkpoint(self, folder: Path) -> None:
        """Fill the live model and optimizer in place from ``folder``.

        Args:
            folder: A ``model/`` folder that ``save_checkpoint`` wrote.

        Raises:
            CheckpointError: ``folder`` holds no checkpoint of this kind or does not fit.
        """
        ...


def is_peft(model: Any) -> bool:
    """Whether ``model`` is a ``peft.PeftModel``, without importing peft.

    Args:
        model: Any model.

    Returns:
        ``True`` for a LoRA-wrapped model.
    """
    peft = sys.modules.get("peft")  # a PeftModel cannot exist unless peft was imported
    return peft is not None and isinstance(model, peft.PeftModel)


def save_model(model: Any, tokenizer: Any, folder: Path) -> None:
    """Write ``model`` (and ``tokenizer``, when given) into a checkpoint's ``model/`` folder.

    Args:
        model: A ``PreTrainedModel``, a ``PeftModel`` or a :class:`ShardedModel`.
        tokenizer: Saved alongside when not ``None``, making the folder servable.
        folder: The ``model/`` folder.
    """
    if isinstance(model, ShardedModel):  # every rank writes its part
        model.save_checkpoint(folder)
    else:
        model.save_pretrained(folder)  # a PeftModel writes only its adapter and adapter_config.json
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)


def load_model(model: Any, folder: Path) -> None:
    """Fill ``model`` in place from a checkpoint's ``model/`` folder.

    Args:
        model: Built like the model saved: the same kind, LoRA or not.
        folder: The ``model/`` folder.

    Raises:
        CheckpointError: The folder holds another kind of model, or weights that do not fit.
    """
    if isinstance(model, ShardedModel):  # it checks the folder and raises CheckpointError
        model.load_checkpoint(folder)
        return
    has_adapter = (folder / "adapter_config.json").exists()
    if is_peft(model) != has_adapter:
        saved, live = ("a LoRA adapter", "none") if has_adapter else ("a full model", "LoRA")
        raise CheckpointError(f"{folder} holds {saved} but the model has {live}; {_SAME_SETTINGS}")
    if has_adapter:
        _load_adapter(model, folder)
    else:
        _load_full_state(model, _read_safetensors(folder), folder)


def load_into(target: Any, file: Path, what: str) -> None:
    """Load a ``state_dict`` saved with ``torch.save`` into ``target``.

    Args:
        target: An optimizer or LR scheduler.
        file: The ``.pt`` file.
        what: Names ``target`` in the error message (``"optimizer"``, ``"scheduler"``).

    Raises:
        CheckpointError: The file is unreadable or its state does not fit ``target``.
    """
    try:
        target.load_state_dict(torch_load(file))
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{file} does not fit this {what} ({e}); {_SAME_SETTINGS}") from None


def torch_load(file: Path) -> Any:
    """``torch.load`` on the CPU with ``weights_only=True``, its many errors made one.

    Args:
        file: A file written by ``torch.save``.

    Returns:
        What was saved.

    Raises:
        CheckpointError: The file cannot be read.
    """
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # unpickling errors come in many types
        raise CheckpointError(f"cannot read {file} ({e!r}); {WHAT_TO_DO}") from None


def _load_adapter(model: Any, folder: Path) -> None:
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    result = set_peft_model_state_dict(model, load_file(folder / "adapter_model.safetensors"))
    if result.unexpected_keys:
        unexpected = result.unexpected_keys[:3]
        raise CheckpointError(f"{folder}: the model lacks {unexpected}; {_SAME_SETTINGS}")


def _read_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder} has no .safetensors weights; {WHAT_TO_DO}")
    state: dict[str, torch.Tensor] = {}
    for file in files:  # one file, or the shards save_pretrained splits a large model into
        state.update(load_file(file))
    return state


def _load_full_state(model: torch.nn.Module, state: dict[str, torch.Tensor], folder: Path) -> None:
    """Copy ``state`` into ``model`` in place; a key that is absent is fine only when it is tied
    to a loaded one (``save_pretrained`` writes ``lm_head`` once, as the embedding)."""
    try:
        result = model.load_state_dict(state, strict=False)
    except RuntimeError as e:  # shape mismatches raise even when strict=False
        raise CheckpointError(f"{folder} does not fit this model: {e}") from None
    tensors = dict(model.named_parameters(remove_duplicate=False))
    tensors |= dict(model.named_buffers(remove_duplicate=False))
    loaded = {id(tensors[name]) for name in state if name in tensors}
    untied = [name for name in result.missing_keys if id(tensors.get(name)) not in loaded]
    if result.unexpected_keys or untied:
        unexpected = result.unexpected_keys[:3]
        raise CheckpointError(
            f"{folder} does not fit this model: lacks {untied[:3]}, has {unexpected}"
        )
