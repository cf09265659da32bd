"""Checkpoints through the official ``tinker`` SDK: ``save_state`` / ``load_state`` with the
optimizer's state, the listing routes, and a service started again on the same folder
resuming where the stopped one saved (SmolLM2-135M-Instruct on the CPU; the two services of
this module run one after the other)."""

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

LORA_RANK, SEED = 4, 5
ADAM = {"learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8}


@pytest.fixture(scope="module")
def batches(smollm2_dir: Path) -> list[list[Any]]:
    """Two batches of one example each, for the two steps."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    pairs = [("2 + 3 =", " 5"), ("The sky is", " blue.")]
    return [datums([(tokenizer.encode(p), tokenizer.encode(c))]) for p, c in pairs]


def step(training: Any, batch: list[Any]) -> dict[str, float]:
    """One ``forward_backward`` and ``optim_step``; the step's metrics."""
    training.forward_backward(batch, "cross_entropy").result()
    return training.optim_step(tinker.types.AdamParams(**ADAM)).result().metrics


def weights(service: Running, path: str) -> dict[str, Any]:
    """The adapter's tensors of the sampler weights saved at tinker ``path`` (all a LoRA
    version holds)."""
    from safetensors.torch import load_file

    run, kind, name = path.removeprefix("tinker://").split("/")
    folder = service.settings.state_dir / run / kind / name / "adapter"
    return load_file(str(folder / "adapter_model.safetensors"))


def worst(a: dict[str, Any], b: dict[str, Any]) -> float:
    """The largest difference between two sets of the same tensors."""
    assert set(a) == set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory, batches: list) -> dict[str, Any]:
    """A service that trains two steps, saving the training state after the first, then
    stops."""
    running = Running(tmp_path_factory.mktemp("serve-trainer-state"))
    client = running.client()
    training = client.create_lora_training_client(base_model=SMOLLM2_ID, rank=LORA_RANK,
                                                  seed=SEED).result()  # fmt: skip
    step(training, batches[0])
    state = training.save_state("step-1").result()
    training.save_weights_for_sampler("step-1").result()
    metrics = step(training, batches[1])
    uninterrupted = training.save_weights_for_sampler("step-2").result()
    refused = None
    try:
        training.save_state("step-1").result()  # exists, and overwrite is off
    except tinker.RequestFailedError as e:
        refused = e
    out = {"running": running, "run": training.model_id, "state": state.path, "refused": refused,
           "metrics": metrics, "weights": weights(running, uninterrupted.path),
           "sampler_path": uninterrupted.path}  # fmt: skip
    running.stop()
    assert not running.thread.is_alive()
    return out


@pytest.fixture(scope="module")
def second(first: dict) -> Iterator[Running]:
    """A new service on the stopped one's folder."""
    running = Running(first["running"].settings.state_dir)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(second: Running) -> Any:
    return second.client()


def test_a_restarted_service_resumes_from_the_saved_state(
    first: dict, second: Running, client: Any, batches: list
) -> None:
    resumed = client.create_training_client_from_state_with_optimizer(first["state"]).result()
    assert resumed.model_id != first["run"]
    info = resumed.get_info()
    assert info.model_data.model_name == SMOLLM2_ID and info.lora_rank == LORA_RANK
    metrics = step(resumed, batches[1])
    saved = resumed.save_weights_for_sampler("step-2").result()
    assert worst(weights(second, saved.path), first["weights"]) < 1e-6
    assert metrics["grad_norm"] == pytest.approx(first["metrics"]["grad_norm"], rel=1e-5)


def test_weights_without_the_optimizer_take_another_step(
    first: dict, second: Running, client: Any, batches: list
) -> None:
    """Weights alone: the same gradients (the same weights), but Adam starts afresh, so the
    step lands elsewhere; ``load_state_with_optimizer`` on that model puts it back."""
    fresh = client.create_training_client_from_state(first["state"]).result()
    metrics = step(fresh, batches[1])
    assert metrics["grad_norm"] == pytest.approx(first["metrics"]["grad_norm"], rel=1e-5)
    elsewhere = weights(second, fresh.save_weights_for_sampler("fresh").result().path)
    assert worst(elsewhere, first["weights"]) > 1e-4
    with pytest.warns(FutureWarning):  # the SDK prefers a new client; the route is the same
        fresh.load_state_with_optimizer(first["state"]).result()
    step(fresh, batches[1])
    back = weights(second, fresh.save_weights_for_sampler("reloaded").result().path)
    assert worst(back, first["weights"]) < 1e-6


def test_checkpoints_are_listed_after_a_restart(first: dict, second: Running) -> None:
    rest = tinker.RestClient(base_url=second.url, api_key=second.settings.api_key)
    listed = rest.list_checkpoints(first["run"]).result().checkpoints
    assert sorted((c.checkpoint_type, c.checkpoint_id) for c in listed) == [
        ("sampler", "sampler_weights/step-1"), ("sampler", "sampler_weights/step-2"),
        ("training", "weights/step-1"),
    ]  # fmt: skip
    assert {c.tinker_path for c in listed} >= {first["state"], first["sampler_path"]}
    assert all(c.size_bytes > 0 for c in listed)
    run = rest.get_training_run(first["run"]).result()
    assert (run.base_model, run.is_lora, run.lora_rank) == (SMOLLM2_ID, True, LORA_RANK)
    assert run.last_checkpoint.tinker_path == first["state"]
    assert run.last_sampler_checkpoint.checkpoint_id == "sampler_weights/step-2"
    runs = rest.list_training_runs().result()
    assert first["run"] in {r.training_run_id for r in runs.training_runs}
    assert runs.cursor.total_count == len(runs.training_runs) >= 1
    info = rest.get_weights_info_by_tinker_path(first["state"]).result()
    assert (info.base_model, info.is_lora, info.lora_rank) == (SMOLLM2_ID, True, LORA_RANK)
    every = rest.list_user_checkpoints().result()
    assert {c.tinker_path for c in listed} <= {c.tinker_path for c in every.checkpoints}


def test_an_existing_checkpoint_is_not_overwritten_unasked(first: dict) -> None:
    assert first["refused"] is not None
    assert "overwrite=True" in str(first["refused"])
    assert first["refused"].category == tinker.types.RequestErrorCategory.User


def test_a_restarted_service_samples_an_earlier_services_weights(first: dict,
                                                                 client: Any) -> None:  # fmt: skip
    sampler = client.create_sampling_client(model_path=first["sampler_path"]).result()
    params = tinker.types.SamplingParams(max_tokens=2, temperature=0.0)
    out = sampler.sample(tinker.types.ModelInput.from_ints([1, 2, 3]), 1, params).result()
    assert len(out.sequences[0].tokens) == 2


def test_a_path_with_nothing_saved_is_refused(client: Any, first: dict) -> None:
    with pytest.raises(tinker.BadRequestError) as refused:
        client.create_training_client_from_state(f"tinker://{first['run']}/weights/nope").result()
    assert "nothing is saved at" in str(refused.value)
