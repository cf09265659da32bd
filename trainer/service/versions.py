"""What a ``save_weights_for_sampler`` folder holds, and what a sampling folder samples.

A LoRA model's saved version is its adapter alone, in PEFT's format, under
``<folder>/adapter`` (:func:`save_adapter`; a few MB: SmolLM2-135M's full weights are ~540 MB
in float32). The base model it adapts is its run's ``base_model`` (``run.json``, see
:mod:`~envhub.trainer.service.checkpoints`), resolved through the served models, so a version
saved every step costs the adapter's bytes only. A model that trains every weight saves a
full HF folder (``config.json``, ``model.safetensors``, tokenizer) and its own logprobs of the
weight-sync check's fixed sequence (:func:`save_reference`): the vLLM sampler checks the
weights it loads against them, as ``envhub train`` checks every sync against its trainer.

Stores written before the adapter-only format hold a LoRA version as the merged HF weights
with the adapter beside them; the HF sampler loads such a folder as it is (it holds model
weights), the vLLM sampler takes its adapter.

Torch-free at import: the adapter is written with torch, PEFT and safetensors imported inside.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envhub.errors import ConfigError
from envhub.trainer.service.checkpoints import Store
from envhub.trainer.service.settings import ServiceSettings

ADAPTER_DIR = "adapter"
"""The subfolder of a LoRA model's saved version that holds its adapter (PEFT's format)."""
REFERENCE_FILE = "reference_logprobs.json"
"""A full-weight version's file of its model's logprobs of the fixed sequence (``ids`` and
``logprobs``: each token's after the first)."""


def save_adapter(model: Any, folder: Path) -> None:
    """Write the LoRA adapter of ``model`` (a
    :class:`~envhub.trainer.service.training.TrainingModel` on a shared base; on the trainer
    thread) into ``folder/adapter`` in PEFT's format; nothing for a full-weight model."""
    if model.shared is None:
        return
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    peft_model, name = model.shared.backend.model, model.adapter
    target = folder / ADAPTER_DIR
    target.mkdir()
    tensors = get_peft_model_state_dict(peft_model, adapter_name=name)
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()},
              str(target / "adapter_model.safetensors"), metadata={"format": "pt"})  # fmt: skip
    peft_model.peft_config[name].save_pretrained(str(target))


def save_reference(model: Any, folder: Path) -> None:
    """Write ``model``'s logprobs of the weight-sync check's fixed sequence
    (:class:`~envhub.trainer.weight_sync.verify.Verifier`, tokenised by the tokenizer saved in
    ``folder``) into ``folder`` (a full-weight model's saved version; on the trainer thread)."""
    import numpy as np
    from transformers import AutoTokenizer

    from envhub.trainer.service.wire import Datum, ForwardRequest
    from envhub.trainer.weight_sync.verify import Verifier

    ids = Verifier(AutoTokenizer.from_pretrained(folder)).ids
    datum = Datum(ids[:-1], {"target_tokens": np.array(ids[1:], dtype=np.int64)})
    outputs, _ = model.forward(ForwardRequest("", 0, "cross_entropy", {}, True, [datum]))
    logprobs = [float(v) for v in outputs[0]["logprobs"]]
    (folder / REFERENCE_FILE).write_text(json.dumps({"ids": ids, "logprobs": logprobs}))


def run_of(folder: str | Path) -> str:
    """The training model (run id) that saved ``folder``
    (``<state_dir>/<run id>/sampler_weights/<name>``)."""
    return Path(folder).parent.parent.name


def folder_stamp(folder: str | Path) -> tuple[int, int]:
    """``folder``'s inode and modification time: a save under the same name replaces the
    folder (a new one renamed into place), so its stamp says which save a loaded version is.
    A Hub id has none (0, 0)."""
    try:
        info = os.stat(folder)
    except OSError:
        return 0, 0
    return info.st_ino, info.st_mtime_ns


@dataclass(frozen=True)
class Version:
    """What a sampling session's folder samples: a model folder, with an adapter or without."""

    base: str
    """An HF model folder (or Hub id): a served base model's, or saved full weights."""
    adapter: Path | None
    """The LoRA adapter's folder to apply to ``base``; None: ``base`` itself."""


def holds_weights(folder: str | Path) -> bool:
    """Whether ``folder`` is a whole HF model (a base model, full weights, an old merged
    version) rather than an adapter-only version."""
    return (Path(folder) / "config.json").is_file()


def adapter_version(folder: str | Path, settings: ServiceSettings) -> Version | None:
    """The base model and adapter of the saved version in ``folder``; None when it holds no
    adapter (full weights, or a base model's folder).

    Raises:
        ConfigError: Its run's base model is no longer served.
    """
    from envhub.trainer.models import resolve_model

    adapter = Path(folder) / ADAPTER_DIR
    if not (adapter / "adapter_config.json").is_file():
        return None
    name = Store(settings.state_dir).run(run_of(folder))["base_model"]
    served = settings.served()
    if name not in served:
        raise ConfigError(f"base model {name!r} is not served here")
    return Version(resolve_model(served[name]), adapter)


def hf_version(folder: str, settings: ServiceSettings) -> Version:
    """What the HF sampler loads for ``folder``: the folder itself when it holds model weights
    (as every version did before adapter-only saves), else its base model and adapter.

    Raises:
        ConfigError: Neither model weights nor an adapter, or an unserved base model.
    """
    if holds_weights(folder):
        return Version(folder, None)
    version = adapter_version(folder, settings)
    if version is None:
        raise ConfigError(f"{folder} holds neither model weights nor a LoRA adapter")
    return version
