"""The vLLM sampler's bookkeeping without an engine: what a failed start leaves, what is
refused before any engine starts, how full-weight engines take turns, are capped, replaced and
stopped (the engines themselves: test_vllm_sampling.py, test_vllm_full_weights.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
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


def test_a_dead_base_engine_is_replaced_on_the_next_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A base model's engine that died (its process gone, or a request found it dead) is
    stopped and a new one started for the next request; a live one is reused."""
    from envhub.trainer.service.vllm_sampling import Engine

    log: list[str] = []

    async def start(engine: Engine) -> None:
        log.append("start")

    async def stop(engine: Engine) -> None:
        log.append("stop")

    monkeypatch.setattr(Engine, "start", start)
    monkeypatch.setattr(Engine, "aclose", stop)
    monkeypatch.setattr(Engine, "alive", lambda engine: not engine.failed)
    samplers, model = _samplers(tmp_path)

    async def main() -> None:
        first = (await samplers.get(str(model))).engine
        assert (await samplers.get(str(model))).engine is first
        first.failed = True  # what a request that met the death sets
        second = (await samplers.get(str(model))).engine
        assert second is not first and samplers.engines == {str(model): second}

    asyncio.run(main())
    assert log == ["start", "stop", "start"]


def test_empty_folders_and_unknown_bases_are_refused(tmp_path: Path) -> None:
    import json

    from envhub.errors import ConfigError

    samplers, _ = _samplers(tmp_path)
    saved = tmp_path / "state" / "run-1" / "sampler_weights" / "v1"
    saved.mkdir(parents=True)
    with pytest.raises(ConfigError, match="holds neither model weights nor a LoRA adapter"):
        samplers.version(str(saved))
    (saved / "adapter").mkdir()
    (saved / "adapter" / "adapter_config.json").write_text(json.dumps({"r": 4}))
    (tmp_path / "state" / "run-1" / "run.json").write_text(json.dumps({"base_model": "gone"}))
    with pytest.raises(ConfigError, match="base model 'gone' is not served here"):
        samplers.version(str(saved))


def test_a_full_weight_version_goes_to_its_models_engine(tmp_path: Path) -> None:
    samplers, model = _samplers(tmp_path)
    saved = _saved(tmp_path, "run-1", "v1")
    assert samplers.full_weights_version(str(saved))
    assert not samplers.full_weights_version(str(model))


def _saved(tmp_path: Path, run: str, name: str) -> Path:
    folder = tmp_path / "state" / run / "sampler_weights" / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    return folder


def test_versions_take_turns_in_order_of_arrival() -> None:
    """Requests of the loaded version run together; a request for another version waits for
    them, switches the weights alone, and a request that came after it waits for its turn
    even when it asks for the version loaded before."""
    from envhub.trainer.service.vllm_full_weights import VersionTurns

    a, b = ("a", 1, 1), ("b", 1, 1)
    turns = VersionTurns(a)
    events: list[str] = []

    async def switch(version: tuple) -> None:
        events.append(f"switch {version[0]}")
        await asyncio.sleep(0.01)

    async def request(name: str, version: tuple, hold: float) -> None:
        async with turns.holding(version, switch):
            events.append(f"in {name}")
            await asyncio.sleep(hold)
            events.append(f"out {name}")

    async def main() -> None:
        first = asyncio.create_task(request("a1", a, 0.05))
        await asyncio.sleep(0.01)
        second = asyncio.create_task(request("a2", a, 0.01))  # joins a1
        await asyncio.sleep(0.001)
        other = asyncio.create_task(request("b1", b, 0.01))  # waits for a1 and a2
        await asyncio.sleep(0.001)
        late = asyncio.create_task(request("a3", a, 0.01))  # after b1, though a is loaded
        await asyncio.gather(first, second, other, late)

    asyncio.run(main())
    assert events == [
        "in a1", "in a2", "out a2", "out a1", "switch b", "in b1", "out b1", "switch a",
        "in a3", "out a3",
    ]  # fmt: skip
    assert turns.loaded == a and turns.idle()


def test_a_failed_switch_loads_again_on_the_next_request() -> None:
    from envhub.trainer.service.vllm_full_weights import VersionTurns

    a, b = ("a", 1, 1), ("b", 1, 1)
    turns = VersionTurns(a)
    loaded: list[str] = []

    async def fail(version: tuple) -> None:
        raise OSError("the engine went away")

    async def switch(version: tuple) -> None:
        loaded.append(version[0])

    async def use(version: tuple, how: Any) -> None:
        async with turns.holding(version, how):
            pass

    with pytest.raises(OSError):
        asyncio.run(use(b, fail))
    assert turns.loaded is None and turns.idle()
    asyncio.run(use(a, switch))
    assert loaded == ["a"] and turns.loaded == a


class _FakeEngine:
    """What the full-weight bookkeeping asks of an engine (no vLLM)."""

    def __init__(self, folder: str, log: list[str]) -> None:
        self.model, self.log, self.dead = folder, log, False
        self.server = SimpleNamespace(log_path="/dev/null")

    def alive(self) -> bool:
        return not self.dead

    async def aclose(self) -> None:
        from envhub.trainer.service.versions import run_of

        self.log.append(f"stop {run_of(self.model)}")


def _full_weight_engines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cap: int) -> Any:
    """``FullWeightEngines`` under ``cap`` whose engines are fakes; starts and stops logged."""
    from envhub.trainer.service import ServiceSettings
    from envhub.trainer.service.versions import run_of
    from envhub.trainer.service.vllm_full_weights import (
        FullWeightEngines,
        VersionTurns,
        version_key,
    )

    settings = ServiceSettings(state_dir=tmp_path / "state", device="cpu", sampler="vllm",
                               vllm_max_full_weight_engines=cap)  # fmt: skip
    engines = FullWeightEngines(settings)
    engines.log = []

    async def start(self: Any, folder: str) -> Any:
        engines.log.append(f"start {run_of(folder)}")
        engine = _FakeEngine(folder, engines.log)
        found = SimpleNamespace(engine=engine, turns=VersionTurns(version_key(folder)),
                                folders=set(), aclose=engine.aclose)  # fmt: skip
        return found

    monkeypatch.setattr(FullWeightEngines, "_start", start)
    return engines


def test_the_least_recently_used_idle_engine_stops_beyond_the_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engines = _full_weight_engines(tmp_path, monkeypatch, cap=2)
    folders = {run: str(_saved(tmp_path, run, "v1")) for run in ("r1", "r2", "r3")}
    v2 = str(_saved(tmp_path, "r1", "v2"))

    async def main() -> None:
        await engines.get(folders["r1"])
        await engines.get(folders["r2"])
        await engines.get(v2)  # r1 used last: r2 is the least recently used
        await engines.get(folders["r3"])
        await engines.aclose()

    asyncio.run(main())
    assert engines.log == ["start r1", "start r2", "stop r2", "start r3", "stop r1", "stop r3"]


def test_a_dead_engine_is_replaced_and_a_sessions_end_stops_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engines = _full_weight_engines(tmp_path, monkeypatch, cap=2)
    v1, v2 = (str(_saved(tmp_path, "r1", name)) for name in ("v1", "v2"))

    async def main() -> None:
        first = await engines.get(v1)
        first.engine.dead = True
        await engines.get(v1)
        await engines.get(v2)
        await engines.drop(v1)  # v2 is still sampled
        assert list(engines.engines) == ["r1"]
        await engines.drop(v2)

    asyncio.run(main())
    assert engines.log == ["start r1", "stop r1", "start r1", "stop r1"]
    assert engines.engines == {}


def test_a_folders_weights_come_a_layer_after_another(tmp_path: Path) -> None:
    """In vLLM's layer order (the transfer refuses another), though the file sorts its names
    as text; the embeddings first, the final norm last."""
    pytest.importorskip("vllm")
    import torch
    from safetensors.torch import save_file

    from envhub.trainer.service.vllm_full_weights import folder_weights

    names = [f"model.layers.{i}.{w}.weight" for i in range(12) for w in ("mlp", "norm")]
    tensors = {name: torch.zeros(1) for name in [*names, "model.embed_tokens.weight",
                                                 "model.norm.weight"]}  # fmt: skip
    save_file(tensors, str(tmp_path / "model.safetensors"))
    order = [name for name, _ in folder_weights(tmp_path)]
    assert order == ["model.embed_tokens.weight", *names, "model.norm.weight"]
