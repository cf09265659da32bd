"""The vLLM sampler's bookkeeping without an engine: what a failed start leaves, what is
refused before any engine starts (the engine itself: test_vllm_sampling.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")


def _samplers(tmp_path: Path) -> Any:
    from envhub.trainer.service import ServiceSettings
    from envhub.trainer.service.vllm_sampling import VLLMSamplers

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"max_position_embeddings": 512}')
    settings = ServiceSettings(models=(f"m={model}",), state_dir=tmp_path / "state",
                               device="cpu", sampler="vllm")  # fmt: skip
    return VLLMSamplers(settings), model


def test_a_failed_start_leaves_no_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from envhub.errors import EngineStartError
    from envhub.trainer.service.vllm_sampling import Engine

    stopped = []

    async def fail(engine: Engine) -> None:
        raise EngineStartError("no vLLM here", "/dev/null")

    async def stop(engine: Engine) -> None:
        stopped.append(engine.model)

    monkeypatch.setattr(Engine, "start", fail)
    monkeypatch.setattr(Engine, "aclose", stop)
    samplers, model = _samplers(tmp_path)
    with pytest.raises(EngineStartError, match="no vLLM here"):
        asyncio.run(samplers.get(str(model)))
    assert samplers.engines == {}
    assert stopped == [str(model)]


def test_full_weights_and_unknown_bases_are_refused(tmp_path: Path) -> None:
    import json

    from envhub.errors import ConfigError

    samplers, _ = _samplers(tmp_path)
    saved = tmp_path / "state" / "run-1" / "sampler_weights" / "v1"
    saved.mkdir(parents=True)
    with pytest.raises(ConfigError, match="holds full weights .* --sampler hf"):
        samplers.version(str(saved))
    (saved / "adapter").mkdir()
    (saved / "adapter" / "adapter_config.json").write_text(json.dumps({"r": 4}))
    (tmp_path / "state" / "run-1" / "run.json").write_text(json.dumps({"base_model": "gone"}))
    with pytest.raises(ConfigError, match="base model 'gone' is not served here"):
        samplers.version(str(saved))
