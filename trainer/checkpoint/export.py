"""HF export: a plain folder of safetensors, config and tokenizer that transformers and vLLM load.

The folder is written next to its target and renamed into place, like a checkpoint, so a reader
never sees half an export; an existing model folder at the target is replaced, anything else
there is refused.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from envhub.errors import ConfigError
from envhub.trainer.checkpoint.files import clean_stale, fsync_tree, replace_dir, staging
from envhub.trainer.checkpoint.model_state import is_peft

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


def export_hf(
    model: Any, tokenizer: Any, target: str | Path, *, dtype: torch.dtype | str | None = None
) -> Path:
    """Write ``model`` as a plain HF folder (safetensors) that transformers and vLLM load.

    A LoRA ``PeftModel`` is merged on a copy (the live model keeps its adapter). The folder is
    written next to ``target`` and renamed into place; an existing model folder at ``target`` is
    replaced, anything else there is refused.

    Args:
        model: A transformers ``PreTrainedModel`` or a ``peft.PeftModel``.
        tokenizer: Saved alongside when not ``None``.
        target: The folder to create or replace.
        dtype: Cast the exported weights (e.g. ``torch.bfloat16`` or ``"bfloat16"``); the live
            model is not touched.

    Returns:
        ``target``.
    """
    target = Path(target)
    dtype = getattr(torch, dtype, dtype) if isinstance(dtype, str) else dtype
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise ConfigError(f"export dtype must be a torch dtype or its name, got {dtype!r}")
    return _write_atomically(target, lambda tmp: _write_hf(model, tokenizer, tmp, dtype))


def export_hf_weights(
    weights: dict[str, torch.Tensor], source: str | Path, target: str | Path
) -> Path:
    """Write ``weights`` as an HF folder beside the ``source`` model folder's other files.

    For backends whose model is not a transformers module (the Megatron backend's shards). The
    folder is written atomically, and a non-model folder at ``target`` is refused, as
    :func:`export_hf` does.

    Args:
        weights: The full model's tensors under their HF names, tied ones once.
        source: The HF model folder the run started from; its config, generation config and
            tokenizer files are copied, its weights are not.
        target: The folder to create or replace.

    Returns:
        ``target``.
    """

    def write(folder: Path) -> None:
        from safetensors.torch import save_file

        for item in Path(source).iterdir():
            if _is_metadata(item):
                shutil.copy2(item, folder / item.name)
        contiguous = {name: t.contiguous() for name, t in weights.items()}
        save_file(contiguous, folder / "model.safetensors", metadata={"format": "pt"})

    return _write_atomically(Path(target), write)


def _is_metadata(item: Path) -> bool:
    """A file of a model folder other than its weights (config, tokenizer, ...)."""
    weights = item.name.endswith(_WEIGHT_SUFFIXES) or item.name == "model.safetensors.index.json"
    return item.is_file() and not weights


def _write_atomically(target: Path, write: Callable[[Path], None]) -> Path:
    """Run ``write(folder)`` on a temporary folder next to ``target``, then rename it into
    place (replacing a model folder there, refusing anything else)."""
    _check_replaceable(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    clean_stale(target.parent, f".tmp-*{target.name}-*")
    with staging(target.parent / f".tmp-{target.name}-{os.getpid()}") as tmp:
        write(tmp)
        fsync_tree(tmp)
        replace_dir(tmp, target)
    return target


def _write_hf(model: Any, tokenizer: Any, folder: Path, dtype: torch.dtype | None) -> None:
    if is_peft(model):
        # on a copy: merging in place would change the live model
        merged = copy.deepcopy(model).merge_and_unload()
        if dtype is not None:
            merged.to(dtype)
        merged.save_pretrained(folder)
    elif dtype is None or dtype == model.dtype:
        model.save_pretrained(folder)
    else:
        model.save_pretrained(folder, state_dict=_cast_state(model.state_dict(), dtype))
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        config["dtype"] = str(dtype).removeprefix("torch.")  # save_pretrained wrote the live one
        (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)


def _cast_state(state: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Floating tensors cast to ``dtype``; tied tensors stay one tensor, so saving still drops
    the duplicate instead of failing on two copies."""
    cast: dict[int, torch.Tensor] = {}
    out = {}
    for name, tensor in state.items():
        if not tensor.is_floating_point():
            out[name] = tensor
            continue
        key = tensor.untyped_storage().data_ptr() + tensor.storage_offset()
        if key not in cast:
            cast[key] = tensor.detach().to(dtype)
        out[name] = cast[key]
    return out


def _check_replaceable(target: Path) -> None:
    if not target.exists():
        return
    is_model = (target / "config.json").is_file() or (target / "adapter_config.json").is_file()
    if not is_model and (target.is_file() or any(target.iterdir())):
        raise ConfigError(
            f"{target} exists and is not a model folder: pick another path or delete it"
        )
