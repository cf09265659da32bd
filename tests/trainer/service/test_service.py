"""The training service driven by the official ``tinker`` SDK, checked against envhub's own
torch backend on the same data (SmolLM2-135M-Instruct on the CPU, one server per module)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

tinker = pytest.importorskip("tinker")
torch = pytest.importorskip("torch")

from envhub.defaults import SMOLLM2_ID  # noqa: E402
from tests.trainer.service.serving import Running, datums  # noqa: E402

pytestmark = pytest.mark.model

LR, BETAS, EPS = 1e-3, (0.9, 0.999), 1e-8
LORA_RANK, SEED = 8, 3


@pytest.fixture(scope="module")
def service(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    running = Running(tmp_path_factory.mktemp("serve-trainer"))
    yield running
    running.stop()
    assert not running.thread.is_alive()


@pytest.fixture(scope="module")
def client(service: Running) -> Any:
    return service.client()


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="module")
def examples(tokenizer: Any) -> list[tuple[list[int], list[int]]]:
    """Two (prompt, completion) token lists of different lengths."""
    pairs = [("What is 2 + 3?", " 2 + 3 = 5."), ("Name a colour.", " Blue, like the sky.")]
    return [(tokenizer.encode(p), tokenizer.encode(c)) for p, c in pairs]


@pytest.fixture(scope="module")
def reference(examples: list[tuple[list[int], list[int]]]) -> dict[str, Any]:
    """What envhub's torch backend computes on ``examples``: the logprobs before the step, the
    supervised update's loss, and the backend itself after one AdamW step."""
    from envhub.trainer.backends.base import sequence_logprobs
    from envhub.trainer.backends.torch_backend import TorchBackend
    from envhub.trainer.batch import Batch, Sample
    from envhub.trainer.config import validate_config
    from envhub.trainer.sft.step import supervised_spec

    config = validate_config({
        "model": {"name": SMOLLM2_ID, "dtype": "float32",
                  "lora": {"rank": LORA_RANK, "target_modules": "all-linear"}},
        "envs": [{"name": "arithmetic"}],
        "rollout": {"temperature": 1.0},
        "optimizer": {"lr": LR, "betas": list(BETAS), "grad_clip": None},
        "backend": {"device": "cpu"},
    })  # fmt: skip
    torch.manual_seed(SEED)  # as the service seeds it: the same LoRA initialisation
    backend = TorchBackend(config)
    sequences = [p + c for p, c in examples]
    before = [sequence_logprobs(backend, ids, temperature=1.0) for ids in sequences]
    samples = [
        Sample(p + c, [0] * len(p) + [1] * len(c), [0.0] * len(p + c), 0.0, i, supervised=1.0)
        for i, (p, c) in enumerate(examples)
    ]
    batch = Batch(samples)
    result = backend.update(
        backend.micro_batches(batch), supervised_spec(), old_logprobs=None, ref_logprobs=None,
        num_tokens=batch.num_tokens, num_sequences=batch.num_sequences,
    )  # fmt: skip
    return {"backend": backend, "before": before, "loss": result.metrics["loss"]}


@pytest.fixture(scope="module")
def trained(client: Any, examples: list, reference: dict) -> dict[str, Any]:
    """One session's round trip: create model -> forward_backward -> optim_step -> save."""
    training = client.create_lora_training_client(base_model=SMOLLM2_ID, rank=LORA_RANK,
                                                  seed=SEED).result()  # fmt: skip
    data = datums(examples)
    forward = training.forward_backward(data, "cross_entropy").result()
    adam = tinker.types.AdamParams(learning_rate=LR, beta1=BETAS[0], beta2=BETAS[1], eps=EPS)
    step = training.optim_step(adam).result()
    saved = training.save_weights_for_sampler("step-1").result()
    return {"training": training, "forward": forward, "step": step, "saved": saved}


def test_forward_backward_matches_the_backend(trained: dict, reference: dict) -> None:
    forward = trained["forward"]
    for output, expected in zip(forward.loss_fn_outputs, reference["before"], strict=True):
        got = output["logprobs"].to_numpy()
        assert got.shape == (len(expected),)
        assert got == pytest.approx(expected, abs=2e-5)
    assert forward.metrics["loss:sum"] == pytest.approx(reference["loss"], rel=1e-5)


ADAPTER_FILES = ["adapter/adapter_config.json", "adapter/adapter_model.safetensors",
                 "checkpoint.json"]  # fmt: skip
"""What a LoRA model's sampler save holds: its adapter, no model weights."""


def files_of(folder: Path) -> list[str]:
    """The files under ``folder``, by their paths in it."""
    return sorted(str(f.relative_to(folder)) for f in folder.rglob("*") if f.is_file())


def test_optim_step_gives_the_backends_weights(trained: dict, reference: dict,
                                               service: Running) -> None:  # fmt: skip
    """The sampler save is the adapter alone (~10 MB at rank 8, the full weights ~540 MB);
    merged into the base as the HF sampler merges it, it gives the reference's weights."""
    from envhub.trainer.backends.torch_backend import hf_weights
    from envhub.trainer.service.sampling import load_model
    from envhub.trainer.service.versions import hf_version

    model_id = trained["training"].model_id
    assert trained["saved"].path == f"tinker://{model_id}/sampler_weights/step-1"
    folder = service.settings.state_dir / model_id / "sampler_weights" / "step-1"
    assert files_of(folder) == ADAPTER_FILES
    assert sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) < 50e6
    version = hf_version(str(folder), service.settings)
    assert version.adapter == folder / "adapter"
    saved = dict(hf_weights(load_model(version.base, version.adapter)))
    with torch.no_grad():  # weights() is a generator: its merge runs when iterated, here
        expected = dict(reference["backend"].weights())
    assert set(saved) == set(expected)
    worst = max(float((saved[k] - expected[k]).abs().max()) for k in expected)
    assert worst < 1e-6
    assert trained["step"].metrics["learning_rate"] == LR


def test_sample_from_the_saved_weights(client: Any, trained: dict, reference: dict,
                                       examples: list) -> None:  # fmt: skip
    from envhub.trainer.backends.base import sequence_logprobs

    sampler = client.create_sampling_client(model_path=trained["saved"].path).result()
    prompt = examples[0][0]
    params = tinker.types.SamplingParams(max_tokens=6, temperature=1.0, seed=7)
    response = sampler.sample(tinker.types.ModelInput.from_ints(prompt), 2, params).result()
    assert len(response.sequences) == 2
    for sequence in response.sequences:
        assert 1 <= len(sequence.tokens) <= 6
        assert sequence.stop_reason in ("stop", "length")
        if sequence.stop_reason == "length":
            assert len(sequence.tokens) == 6
        scored = sequence_logprobs(reference["backend"], prompt + sequence.tokens, 1.0)
        assert sequence.logprobs == pytest.approx(scored[len(prompt) - 1 :], abs=1e-4)


def test_futures_resolve_in_order(client: Any, examples: list, reference: dict) -> None:
    """Requests sent without waiting run in the order sent: a forward before the step sees
    the old weights, one after it the new ones (the reference backend's, after its step)."""
    from envhub.trainer.backends.base import sequence_logprobs

    training = client.create_lora_training_client(base_model=SMOLLM2_ID, rank=LORA_RANK,
                                                  seed=SEED).result()  # fmt: skip
    data = datums(examples)
    adam = tinker.types.AdamParams(learning_rate=LR, beta1=BETAS[0], beta2=BETAS[1], eps=EPS)
    futures = [
        training.forward(data, "cross_entropy"),
        training.forward_backward(data, "cross_entropy"),
        training.optim_step(adam),
        training.forward(data, "cross_entropy"),
    ]
    first, backward, _, after = [f.result() for f in futures]
    for out, expected in zip(first.loss_fn_outputs, reference["before"], strict=True):
        assert out["logprobs"].to_numpy() == pytest.approx(expected, abs=2e-5)
    assert first.metrics == backward.metrics
    for out, (p, c) in zip(after.loss_fn_outputs, examples, strict=True):
        stepped = sequence_logprobs(reference["backend"], p + c, 1.0)
        assert out["logprobs"].to_numpy() == pytest.approx(stepped, abs=2e-5)


def test_a_wrong_key_is_refused(service: Running) -> None:
    with pytest.raises(tinker.AuthenticationError) as refused:
        service.client(api_key="tml-wrong").create_lora_training_client(
            base_model=SMOLLM2_ID, rank=LORA_RANK
        ).result()
    assert refused.value.status_code == 401
    assert "TINKER_API_KEY" in str(refused.value.body)


def test_an_unknown_loss_fails_the_request(client: Any, trained: dict, examples: list) -> None:
    with pytest.raises(tinker.RequestFailedError) as failed:
        trained["training"].forward(datums(examples), "no_such_loss").result()
    assert "'no_such_loss' is not served" in str(failed.value)
    assert failed.value.category == tinker.types.RequestErrorCategory.User


def test_unnamed_save_samples_and_stops_at_a_stop_token(trained: dict, examples: list,
                                                        reference: dict) -> None:  # fmt: skip
    """``save_weights_and_get_sampling_client`` saves the same weights under a session of
    their own; a stop token id cuts the completion after it."""
    from envhub.trainer.backends.base import sequence_logprobs

    sampler = trained["training"].save_weights_and_get_sampling_client().result()
    prompt = examples[0][0]
    greedy = tinker.types.SamplingParams(max_tokens=5, temperature=0.0)
    first = sampler.sample(tinker.types.ModelInput.from_ints(prompt), 1, greedy).result()
    tokens = first.sequences[0].tokens
    assert len(tokens) == 5 and first.sequences[0].stop_reason == "length"
    scored = sequence_logprobs(reference["backend"], prompt + tokens, 1.0)[len(prompt) - 1 :]
    assert first.sequences[0].logprobs == pytest.approx(scored, abs=1e-4)
    stop = tinker.types.SamplingParams(max_tokens=5, temperature=0.0, stop=[tokens[1]])
    cut = sampler.sample(tinker.types.ModelInput.from_ints(prompt), 1, stop).result()
    assert cut.sequences[0].tokens == tokens[: tokens.index(tokens[1]) + 1]
    assert cut.sequences[0].stop_reason == "stop"


def scored(training: Any, prompt: list[int], completion: list[int]) -> list[float]:
    """``training``'s logprobs of ``completion`` after ``prompt`` (a forward, no gradients)."""
    tokens = prompt + completion
    datum = tinker.types.Datum(model_input=tinker.types.ModelInput.from_ints(tokens[:-1]),
                               loss_fn_inputs={"target_tokens": tokens[1:]})  # fmt: skip
    out = training.forward([datum], "cross_entropy").result()
    return out.loss_fn_outputs[0]["logprobs"].to_numpy()[len(prompt) - 1 :].tolist()


def test_two_sessions_adapters_stay_apart(service: Running, trained: dict, reference: dict,
                                          examples: list, tokenizer: Any) -> None:  # fmt: skip
    """A second session's adapter, from the same seed but trained on other data, changes
    nothing of the first's: the first still scores as the reference backend after its one
    step, and each one's sampler samples (and scores) its own weights."""
    from envhub.trainer.backends.base import sequence_logprobs

    other = service.client()
    second = other.create_lora_training_client(base_model=SMOLLM2_ID, rank=LORA_RANK,
                                               seed=SEED).result()  # fmt: skip
    pairs = [("Say hello.", " Hello there!"), ("Count to three.", " One, two, three.")]
    data = datums([(tokenizer.encode(p), tokenizer.encode(c)) for p, c in pairs])
    second.forward_backward(data, "cross_entropy").result()
    adam = tinker.types.AdamParams(learning_rate=LR, beta1=BETAS[0], beta2=BETAS[1], eps=EPS)
    second.optim_step(adam).result()
    first = trained["training"]
    prompt, completion = examples[0]
    mine = scored(first, prompt, completion)
    expected = sequence_logprobs(reference["backend"], prompt + completion, 1.0)
    assert mine == pytest.approx(expected[len(prompt) - 1 :], abs=2e-5)
    theirs = scored(second, prompt, completion)
    assert max(abs(a - b) for a, b in zip(mine, theirs, strict=True)) > 1e-3
    greedy = tinker.types.SamplingParams(max_tokens=4, temperature=0.0)
    samplers = {"first": first.save_weights_and_get_sampling_client().result(),
                "second": second.save_weights_and_get_sampling_client().result()}  # fmt: skip
    for name, training in (("first", first), ("second", second)):
        out = samplers[name].sample(tinker.types.ModelInput.from_ints(prompt), 1, greedy).result()
        tokens, logprobs = out.sequences[0].tokens, out.sequences[0].logprobs
        assert logprobs == pytest.approx(scored(training, prompt, tokens), abs=1e-4), name
    full = tinker.types.ModelInput.from_ints(prompt + completion)
    for name, own in (("first", mine), ("second", theirs)):
        prompt_scores = samplers[name].compute_logprobs(full).result()
        assert prompt_scores[len(prompt) :] == pytest.approx(own, abs=1e-4), name


def test_prompt_logprobs_equal_envhubs_scoring(client: Any, trained: dict, reference: dict,
                                               examples: list) -> None:  # fmt: skip
    """``compute_logprobs`` on the saved weights scores every token after the first as the
    reference backend does; ``prompt_logprobs_last_n`` leaves the earlier ones unscored."""
    from envhub.trainer.backends.base import sequence_logprobs

    sampler = client.create_sampling_client(model_path=trained["saved"].path).result()
    prompt, completion = examples[1]
    ids = prompt + completion
    expected = sequence_logprobs(reference["backend"], ids, 1.0)
    scored = sampler.compute_logprobs(tinker.types.ModelInput.from_ints(ids)).result()
    assert scored[0] is None and len(scored) == len(ids)
    assert scored[1:] == pytest.approx(expected, abs=1e-4)
    tail = sampler.compute_logprobs(tinker.types.ModelInput.from_ints(ids),
                                    prompt_logprobs_last_n=len(completion)).result()  # fmt: skip
    assert tail[: len(prompt)] == [None] * len(prompt)
    assert tail[len(prompt) :] == pytest.approx(expected[len(prompt) - 1 :], abs=1e-4)


def test_a_seed_gives_the_same_tokens_on_every_call(client: Any, trained: dict,
                                                    examples: list) -> None:  # fmt: skip
    sampler = client.create_sampling_client(model_path=trained["saved"].path).result()
    prompt = tinker.types.ModelInput.from_ints(examples[0][0])
    params = tinker.types.SamplingParams(max_tokens=6, temperature=1.0, seed=11)
    calls = [sampler.sample(prompt, 2, params).result() for _ in range(2)]
    first, again = ([s.tokens for s in c.sequences] for c in calls)
    assert first == again
    other = tinker.types.SamplingParams(max_tokens=6, temperature=1.0, seed=12)
    assert [s.tokens for s in sampler.sample(prompt, 2, other).result().sequences] != first


def test_a_version_saved_again_under_its_name_samples_the_new_weights(
    service: Running, examples: list
) -> None:
    """A sampling client of ``tinker://.../sampler_weights/same`` loaded that version; after
    another step saved under the same name, the same client scores with the new weights (the
    training model's own), not the loaded ones."""
    client = service.client()
    training = client.create_lora_training_client(base_model=SMOLLM2_ID, rank=LORA_RANK,
                                                  seed=SEED).result()  # fmt: skip
    prompt, completion = examples[1]
    ids = prompt + completion
    path = training.save_weights_for_sampler("same").result().path
    sampler = client.create_sampling_client(model_path=path).result()
    before = sampler.compute_logprobs(tinker.types.ModelInput.from_ints(ids)).result()[1:]
    training.forward_backward(datums(examples), "cross_entropy").result()
    training.optim_step(tinker.types.AdamParams(learning_rate=LR)).result()
    assert training.save_weights_for_sampler("same").result().path == path
    after = sampler.compute_logprobs(tinker.types.ModelInput.from_ints(ids)).result()[1:]
    datum = tinker.types.Datum(model_input=tinker.types.ModelInput.from_ints(ids[:-1]),
                               loss_fn_inputs={"target_tokens": ids[1:]})  # fmt: skip
    trainer = training.forward([datum], "cross_entropy").result()
    expected = trainer.loss_fn_outputs[0]["logprobs"].to_numpy().tolist()
    assert after == pytest.approx(expected, abs=1e-4)
    assert max(abs(a - b) for a, b in zip(after, before, strict=True)) > 1e-3
    client.close("success").result()


def test_an_old_merged_version_loads_as_before(
    service: Running, trained: dict, reference: dict, examples: list
) -> None:
    """A version saved as stores before adapter-only saves held it (the merged HF weights and
    the adapter beside them) loads as that HF folder, and samples as the trainer scores."""
    from envhub.trainer.backends.base import sequence_logprobs
    from envhub.trainer.service.versions import save_adapter

    state = service.app.app.state.service
    model_id = trained["training"].model_id
    model = state.model(model_id)

    def fill(folder: Path) -> None:  # what save_for_sampler wrote before
        model.export(folder)
        save_adapter(model, folder)

    write = (state.store.write, model_id, "sampler_weights", "old-format", fill)
    path = state._trainer.submit(*write).result()  # on the trainer thread, as the service saves
    folder = service.settings.state_dir / model_id / "sampler_weights" / "old-format"
    assert (folder / "model.safetensors").is_file()
    sampler = service.client().create_sampling_client(model_path=path).result()
    prompt = examples[0][0]
    greedy = tinker.types.SamplingParams(max_tokens=4, temperature=0.0)
    out = sampler.sample(tinker.types.ModelInput.from_ints(prompt), 1, greedy).result()
    tokens = out.sequences[0].tokens
    scored = sequence_logprobs(reference["backend"], prompt + tokens, 1.0)[len(prompt) - 1 :]
    assert out.sequences[0].logprobs == pytest.approx(scored, abs=1e-4)
    loaded = state.samplers._loaded[str(folder)]
    assert (loaded.folder, loaded.adapter) == (str(folder), None)


def test_closing_a_session_frees_its_models_and_samplers(service: Running, trained: dict,
                                                         examples: list) -> None:  # fmt: skip
    """The SDK's ``close`` frees the session's model (its adapter leaves the shared base), its
    sampling session and the sampler it loaded; another session's adapter scores and samples
    exactly as before."""
    import gc
    import weakref

    state = service.app.app.state.service
    first = trained["training"]
    prompt, completion = examples[0]
    greedy = tinker.types.SamplingParams(max_tokens=4, temperature=0.0)
    ids = tinker.types.ModelInput.from_ints(prompt)
    first_sampler = first.save_weights_and_get_sampling_client().result()
    before = (scored(first, prompt, completion), first_sampler.sample(ids, 1, greedy).result())
    closing = service.client()
    training = closing.create_lora_training_client(base_model=SMOLLM2_ID, rank=LORA_RANK,
                                                   seed=SEED).result()  # fmt: skip
    sampler = training.save_weights_and_get_sampling_client().result()
    sampler.sample(ids, 1, greedy).result()
    model = state.model(training.model_id)
    folder = state.sampling_session(sampler._sampling_session_id).folder
    gone = [weakref.ref(model), weakref.ref(state.samplers._loaded[folder])]
    shared, adapter = model.shared, model.adapter
    assert adapter in shared.adapters and adapter in shared.backend.model.peft_config
    del model
    closing.close("success").result()
    assert training.model_id not in state.models
    assert adapter not in shared.adapters and adapter not in shared.backend.model.peft_config
    assert state.bases == {SMOLLM2_ID: state.model(first.model_id).shared}
    assert sampler._sampling_session_id not in state.sampling_sessions
    assert folder not in state.samplers._loaded
    gc.collect()
    assert [ref() for ref in gone] == [None, None]
    after = (scored(first, prompt, completion), first_sampler.sample(ids, 1, greedy).result())
    assert after[0] == before[0]
    assert after[1].sequences[0].tokens == before[1].sequences[0].tokens
    assert after[1].sequences[0].logprobs == before[1].sequences[0].logprobs
