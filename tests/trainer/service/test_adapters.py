"""Several LoRA adapters on one base model, driven by the official ``tinker`` SDK: two
sessions' models share one copy of SmolLM2's weights, and each adapter trains exactly as it
does on a base of its own (checked against :class:`TrainingModel` objects that each load
their own base), with requests of the two interleaved."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

tinker = pytest.importorskip("tinker")
torch = pytest.importorskip("torch")

from envhub.defaults import SMOLLM2_ID  # noqa: E402
from tests.trainer.service.serving import Running  # noqa: E402

pytestmark = pytest.mark.model

RANK = 4
SEEDS = {"a": 1, "b": 2}
ADAM = {"learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
        "weight_decay": 0.0, "grad_clip_norm": 0.0}  # fmt: skip
SMOLLM2_PARAMETERS = 134_515_008
"""SmolLM2-135M's parameter count (its head tied to the embedding)."""


@pytest.fixture(scope="module")
def service(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    running = Running(tmp_path_factory.mktemp("serve-trainer-adapters"))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def examples(smollm2_dir: Path) -> dict[str, list[int]]:
    """A short token sequence per batch."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    return {"x": tokenizer.encode("2 + 3 = 5"), "y": tokenizer.encode("The sky is blue.")}


PLAN = [("a", "fb", "x"), ("b", "fb", "y"), ("a", "step", None), ("b", "fb", "x"),
        ("b", "step", None), ("a", "fb", "y"), ("a", "step", None)]  # fmt: skip
"""The interleaved requests: (model, forward_backward or optim_step, batch)."""


def sdk_datum(tokens: list[int]) -> Any:
    return tinker.types.Datum(model_input=tinker.types.ModelInput.from_ints(tokens[:-1]),
                              loss_fn_inputs={"target_tokens": tokens[1:]})  # fmt: skip


def alone(name: str, examples: dict[str, list[int]]) -> Any:
    """``name``'s part of :data:`PLAN` on a :class:`TrainingModel` with a base of its own."""
    from envhub.trainer.service.training import LoraSpec, TrainingModel
    from envhub.trainer.service.wire import Datum, ForwardRequest

    model = TrainingModel(SMOLLM2_ID, LoraSpec(RANK), SEEDS[name], "cpu")
    for who, verb, batch in PLAN:
        if who != name:
            continue
        if verb == "step":
            model.optim_step(ADAM)
            continue
        tokens = examples[batch]
        datum = Datum(tokens[:-1], {"target_tokens": np.array(tokens[1:])})
        model.forward(ForwardRequest("", 0, "cross_entropy", {}, False, [datum]))
    return model


@pytest.fixture(scope="module")
def trained(service: Running, examples: dict[str, list[int]]) -> dict[str, Any]:
    """Models ``a`` and ``b`` of two sessions, through :data:`PLAN` with every request sent
    before any is waited for."""
    models = {
        name: service.client().create_lora_training_client(
            base_model=SMOLLM2_ID, rank=RANK, seed=seed).result()
        for name, seed in SEEDS.items()
    }  # fmt: skip
    futures = [
        models[who].optim_step(tinker.types.AdamParams(**ADAM)) if verb == "step"
        else models[who].forward_backward([sdk_datum(examples[batch])], "cross_entropy")
        for who, verb, batch in PLAN
    ]  # fmt: skip
    for future in futures:
        future.result()
    return models


def held(service: Running, training: Any) -> Any:
    """The service's :class:`TrainingModel` behind a training client."""
    return service.app.app.state.service.models[training.model_id]


def saved(service: Running, training: Any, name: str) -> dict[str, Any]:
    """The tensors ``save_state(name)`` writes."""
    from safetensors.torch import load_file

    run, kind, checkpoint = training.save_state(name).result().path.split("/")[-3:]
    folder = service.settings.state_dir / run / kind / checkpoint
    return load_file(str(folder / "trainable.safetensors"))


def test_the_adapters_share_one_base(service: Running, trained: dict[str, Any]) -> None:
    a, b = held(service, trained["a"]), held(service, trained["b"])
    assert a.backend is b.backend and a.adapter != b.adapter
    assert service.app.app.state.service.bases == {SMOLLM2_ID: a.shared}
    adapter = sum(p.numel() for _, p in a.shared.parameters(a.adapter))
    assert adapter == sum(p.numel() for _, p in b.shared.parameters(b.adapter)) > 0
    total = sum(p.numel() for p in a.backend.model.parameters())
    assert total == SMOLLM2_PARAMETERS + 2 * adapter


def test_each_adapter_trains_as_on_a_base_of_its_own(
    service: Running, trained: dict[str, Any], examples: dict[str, list[int]]
) -> None:
    """Bit for bit: the same tensors as a model that loaded its own base and ran only its
    own requests; and the two adapters differ."""
    adapters = {name: saved(service, trained[name], f"{name}-alone") for name in SEEDS}
    for name in SEEDS:
        reference = dict(alone(name, examples)._trained())
        assert set(adapters[name]) == set(reference)
        for key, tensor in reference.items():
            assert torch.equal(adapters[name][key], tensor.detach()), (name, key)
    assert not all(torch.equal(adapters["a"][k], adapters["b"][k]) for k in adapters["a"])


def test_sampler_weights_merge_only_their_adapter(service: Running,
                                                  trained: dict[str, Any]) -> None:  # fmt: skip
    """``a``'s sampler weights, as the HF sampler merges them, are the base plus ``a``'s
    adapter, bit for bit: ``b``'s, on the same base, is not in them."""
    from envhub.trainer.backends.torch_backend import hf_weights
    from envhub.trainer.service.sampling import load_model
    from envhub.trainer.service.versions import hf_version

    own, other = held(service, trained["a"]), held(service, trained["b"])
    other.shared.use(other.adapter)  # the base runs b's adapter: a's save takes a's by name
    path = trained["a"].save_weights_for_sampler("a-merged").result().path
    run, kind, name = path.split("/")[-3:]
    version = hf_version(str(service.settings.state_dir / run / kind / name), service.settings)
    weights = dict(hf_weights(load_model(version.base, version.adapter)))
    with torch.no_grad():
        own.shared.use(own.adapter)
        expected = {n: t.clone() for n, t in hf_weights(own.backend.model)}
        other.shared.use(other.adapter)
        with_b = dict(hf_weights(own.backend.model))
    assert set(weights) == set(expected)
    assert all(torch.equal(weights[k], expected[k]) for k in expected)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(weights[q], with_b[q])


def test_a_saved_state_resumes_without_the_other(
    service: Running, trained: dict[str, Any], examples: dict[str, list[int]]
) -> None:
    """``b``'s saved state (its adapter alone) becomes a third adapter on the same base; a
    step on it lands where ``b``'s same step lands, and ``a`` does not move."""
    b_state = trained["b"].save_state("b-resume").result().path
    before_a = saved(service, trained["a"], "a-before")
    client = service.client()
    resumed = client.create_training_client_from_state_with_optimizer(b_state).result()
    assert held(service, resumed).backend is held(service, trained["b"]).backend
    batch = [sdk_datum(examples["y"])]
    for training in (resumed, trained["b"]):
        training.forward_backward(batch, "cross_entropy").result()
        training.optim_step(tinker.types.AdamParams(**ADAM)).result()
    mine, theirs = saved(service, resumed, "c-1"), saved(service, trained["b"], "b-3")
    assert set(mine) == set(before_a) and all(".default." in k for k in mine)
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    after_a = saved(service, trained["a"], "a-after")
    assert all(torch.equal(before_a[k], after_a[k]) for k in before_a)


def test_the_base_goes_with_its_last_adapter(service: Running, trained: dict[str, Any]) -> None:
    """Once every session has ended, the service holds no model and no base."""
    import gc
    import weakref

    base = weakref.ref(held(service, trained["a"]).backend)
    for client in service.clients:
        client.close("success").result()
    state = service.app.app.state.service
    assert (state.models, state.bases, state.sessions) == ({}, {}, {})
    gc.collect()
    assert base() is None
