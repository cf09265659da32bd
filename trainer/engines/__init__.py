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

__all__ = sorted([*_EXPORTS, "make_engine"])


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)


def make_engine(config: Any, backend: Any, cpu_bind: str | None = None) -> Any:
    """The rollout engine of ``config.rollout.engine`` for ``backend`` (a ``TrainConfig`` and a
    ``TrainBackend``; untyped here to keep this package's import light): ``hf`` generates with
    the policy module itself (nothing to sync); ``vllm`` runs vLLM and receives the weights
    after every step, its CPU compute threads bound to ``cpu_bind`` when given (the run's
    core split, ``trainer/cores.py``).

    Raises:
        ConfigError: Unknown engine.
    """
    if config.rollout.engine == "hf":
        from envhub.trainer.engines.hf import HFEngine

        return HFEngine(
            backend.model,
            backend.tokenizer,
            max_batch_size=config.rollout.max_concurrency,
            seed=config.seed,
        )
    if config.rollout.engine == "vllm":
        from envhub.trainer.engines.vllm import make_vllm_engine  # imports vLLM only when it starts

        return make_vllm_engine(config, backend, cpu_bind)
    from envhub.errors import ConfigError

    raise ConfigError(f"unknown rollout engine {config.rollout.engine!r}; available: hf, vllm")
