"""Inference engines that live inside the trainer process.

:class:`HFEngine` samples with the trainer's own ``transformers`` module (colocated, CPU or one
GPU); :class:`HFChatTokenizer` renders conversations with that model's chat template.
"""

from __future__ import annotations

from envhub.trainer.engines.hf import HFEngine
from envhub.trainer.engines.hf_tokenizer import HFChatTokenizer

__all__ = ["HFChatTokenizer", "HFEngine"]
