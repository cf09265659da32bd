"""Inference engines driven by the trainer.

:class:`HFEngine` samples with the trainer's own ``transformers`` module (colocated, CPU or one
GPU); :class:`HFChatTokenizer` renders conversations with that model's chat template;
:class:`VLLMEngine` samples with vLLM (in process or a server) and receives the trainer's weights
after each step (the weights' path to it is ``trainer/weight_sync/``). Imported lazily.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "HFEngine": "envhub.trainer.engines.hf",
    "HFChatTokenizer": "envhub.trainer.engines.hf_tokenizer",
    "VLLMEngine": "envhub.trainer.engines.vllm",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
