"""Custom losses through the official ``tinker`` SDK, both ways it runs them: a callable
passed to ``forward_backward_custom`` runs on the client (a forward, the loss in torch, then a
backward under ``cross_entropy`` with the loss's gradients as weights); a loss made with
``create_custom_loss`` is uploaded and runs on the service in one request. Either must give
the same loss and the same updated adapter as the equivalent built-in loss (fp32 on the
CPU)."""

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

LORA_RANK, SEED = 4, 9
ADAM = tinker.types.AdamParams(learning_rate=1e-3, beta1=0.9, beta2=0.999, eps=1e-8)
WEIGHTS_TOL = 1e-6
"""Largest difference allowed between two adapters' tensors after one step (fp32)."""


@pytest.fixture(scope="module")
def service(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    running = Running(tmp_path_factory.mktemp("serve-trainer-custom"))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(service: Running) -> Any:
    return service.client()


@pytest.fixture(scope="module")
def sequences(smollm2_dir: Path) -> list[tuple[list[int], list[int]]]:
    """(prompt, completion) token lists of two lengths."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    pairs = [("What is 2 + 3?", " 5."), ("Name a colour.", " Blue, like the sky.")]
    return [(tokenizer.encode(p), tokenizer.encode(c)) for p, c in pairs]


def datum(prompt: list[int], completion: list[int], **inputs: Any) -> Any:
    """A datum scoring ``completion`` after ``prompt``; ``inputs`` are per-target arrays."""
    full = prompt + completion
    arrays = {k: tinker.types.TensorData.from_numpy(np.asarray(v, np.float32))
              for k, v in inputs.items()}  # fmt: skip
    return tinker.types.Datum(model_input=tinker.types.ModelInput.from_ints(full[:-1]),
                              loss_fn_inputs={"target_tokens": full[1:], **arrays})  # fmt: skip


def mask(prompt: list[int], completion: list[int]) -> list[float]:
    """1 on the completion's targets, 0 on the prompt's."""
    return [0.0] * (len(prompt) - 1) + [1.0] * len(completion)


def adapter(service: Running, training: Any, name: str) -> dict[str, Any]:
    """The adapter's tensors after ``save_state(name)``."""
    from safetensors.torch import load_file

    path = training.save_state(name).result().path
    run, kind, saved = path.removeprefix("tinker://").split("/")
    folder = service.settings.state_dir / run / kind / saved
    return load_file(str(folder / "trainable.safetensors"))


def worst(a: dict[str, Any], b: dict[str, Any]) -> float:
    assert set(a) == set(b) and a
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def pair(client: Any) -> tuple[Any, Any]:
    """Two training clients whose adapters start equal (the same seed)."""
    return tuple(
        client.create_lora_training_client(
            base_model=SMOLLM2_ID, rank=LORA_RANK, seed=SEED
        ).result()  # fmt: skip
        for _ in range(2)
    )


def test_a_custom_token_mean_nll_equals_cross_entropy(service: Running, client: Any,
                                                      sequences: list) -> None:  # fmt: skip
    """A hand-written token-mean NLL (a callable, run on the client) and ``cross_entropy``
    with weights 1/N: the same loss, gradient norm and adapter after a step."""
    builtin, custom = pair(client)
    masks = [mask(p, c) for p, c in sequences]
    count = sum(sum(m) for m in masks)
    scaled = [datum(p, c, weights=[w / count for w in m])
              for (p, c), m in zip(sequences, masks, strict=True)]  # fmt: skip

    def token_mean_nll(data: list[Any], logprobs: list[Any]) -> tuple[Any, dict[str, float]]:
        weights = [d.loss_fn_inputs["weights"].to_torch() for d in data]
        total = sum(w.sum() for w in weights)
        loss = -sum((lp * w).sum() for lp, w in zip(logprobs, weights, strict=True)) / total
        return loss, {"tokens": float(total)}

    plain = [datum(p, c, weights=m) for (p, c), m in zip(sequences, masks, strict=True)]
    expected = builtin.forward_backward(scaled, "cross_entropy").result()
    got = custom.forward_backward_custom(plain, token_mean_nll).result()
    by_hand = -sum(
        float(np.dot(out["logprobs"].to_numpy(), m))
        for out, m in zip(expected.loss_fn_outputs, masks, strict=True)
    ) / count  # fmt: skip
    assert got.metrics["loss:sum"] == pytest.approx(by_hand, rel=1e-5)
    assert expected.metrics["loss:sum"] == pytest.approx(by_hand, rel=1e-5)
    assert got.metrics["surrogate_loss:sum"] == pytest.approx(by_hand, rel=1e-5)
    assert got.metrics["tokens"] == count
    for mine, theirs in zip(got.loss_fn_outputs, expected.loss_fn_outputs, strict=True):
        assert mine["logprobs"].to_numpy() == pytest.approx(theirs["logprobs"].to_numpy(),
                                                            abs=1e-6)  # fmt: skip
    norms = [t.optim_step(ADAM).result().metrics["grad_norm"] for t in (builtin, custom)]
    assert norms[1] == pytest.approx(norms[0], rel=1e-5) and norms[0] > 0
    assert worst(adapter(service, builtin, "ce"), adapter(service, custom, "nll")) < WEIGHTS_TOL


def test_a_custom_policy_gradient_equals_importance_sampling(service: Running, client: Any,
                                                             sequences: list) -> None:  # fmt: skip
    """``create_custom_loss`` of a ratio-weighted policy gradient (uploaded, run on the
    service) and the built-in ``importance_sampling``: the same loss and adapter."""
    builtin, custom = pair(client)
    first = builtin.forward([datum(p, c) for p, c in sequences], "cross_entropy").result()
    current = [out["logprobs"].to_numpy() for out in first.loss_fn_outputs]
    # the sampler's logprobs a little off the trainer's, so the ratios are not all 1
    sampled = [lp - 0.1 * (np.arange(len(lp)) % 3) for lp in current]
    advantages = [np.where(np.array(mask(p, c)) > 0, 1.0 - 2 * i, 0.0)
                  for i, (p, c) in enumerate(sequences)]  # fmt: skip

    def ratio_pg(logprobs: Any, sampler_logprobs: Any, advantages: Any) -> tuple[Any, dict]:
        loss = -(torch.exp(logprobs - sampler_logprobs) * advantages).sum()
        return loss, {"custom/ratio:mean": torch.exp(logprobs - sampler_logprobs).mean()}

    handle = client.create_custom_loss(
        ratio_pg, {"logprobs": 1, "sampler_logprobs": 1, "advantages": 1}
    ).result()
    assert handle.loss_id == f"{client.holder.get_session_id()}:loss:0"
    rows = list(zip(sequences, sampled, advantages, strict=True))
    expected = builtin.forward_backward(
        [datum(p, c, logprobs=s, advantages=a) for (p, c), s, a in rows],
        "importance_sampling",
    ).result()  # fmt: skip
    got = custom.forward_backward_custom(
        [datum(p, c, sampler_logprobs=s, advantages=a) for (p, c), s, a in rows],
        handle,
    ).result()  # fmt: skip
    by_hand = -sum(float(np.sum(np.exp(lp - s) * a))
                   for lp, s, a in zip(current, sampled, advantages, strict=True))  # fmt: skip
    assert got.metrics["loss:sum"] == pytest.approx(by_hand, rel=1e-5)
    assert expected.metrics["loss:sum"] == pytest.approx(by_hand, rel=1e-5)
    ratios = [float(np.mean(np.exp(lp - s))) for lp, s in zip(current, sampled, strict=True)]
    assert got.metrics["custom/ratio:mean"] == pytest.approx(np.mean(ratios), rel=1e-5)
    norms = [t.optim_step(ADAM).result().metrics["grad_norm"] for t in (builtin, custom)]
    assert norms[1] == pytest.approx(norms[0], rel=1e-5) and norms[0] > 0
    assert worst(adapter(service, builtin, "is"), adapter(service, custom, "pg")) < WEIGHTS_TOL


def test_two_targets_per_position_score_each(client: Any, sequences: list) -> None:
    """``target_tokens`` of shape ``[T, K]`` (a custom loss's distribution support) gives
    ``[T, K]`` logprobs, column for column those of ``[T]`` targets."""
    training = client.create_lora_training_client(base_model=SMOLLM2_ID,
                                                  rank=LORA_RANK).result()  # fmt: skip
    prompt, completion = sequences[1]
    full = prompt + completion
    other = [(t + 7) % 1000 for t in full[1:]]
    wide = tinker.types.Datum(
        model_input=tinker.types.ModelInput.from_ints(full[:-1]),
        loss_fn_inputs={"target_tokens": tinker.types.TensorData.from_numpy(
            np.stack([full[1:], other], axis=1).astype(np.int64))},
    )  # fmt: skip
    narrow = [datum(prompt, completion), tinker.types.Datum(
        model_input=tinker.types.ModelInput.from_ints(full[:-1]),
        loss_fn_inputs={"target_tokens": other})]  # fmt: skip
    out = training.forward([wide, *narrow], "cross_entropy").result().loss_fn_outputs
    scores = out[0]["logprobs"].to_numpy().reshape(out[0]["logprobs"].shape)
    assert scores.shape == (len(full) - 1, 2)
    for column, single in enumerate(out[1:]):
        assert scores[:, column] == pytest.approx(single["logprobs"].to_numpy(), abs=1e-6)


def test_a_loss_outside_the_allow_lists_is_refused(service: Running, client: Any) -> None:
    """The service rebuilds an uploaded graph from its own lists, whatever the client checked:
    a node calling ``os.system`` (sent by hand, the SDK would not) is refused by name."""
    import httpx

    session = client.holder.get_session_id()
    nodes = [{"op": "placeholder", "name": "logprobs", "target": "logprobs"},
             {"op": "call_function", "name": "run", "target": "os.system", "args": ["true"]},
             {"op": "output", "name": "output", "target": "output",
              "args": [{"tuple": [{"ref": "run"}, {"dict": {}}]}]}]  # fmt: skip
    body = {"session_id": session, "custom_loss_seq_id": 99, "name": "shell",
            "inputs": [{"name": "logprobs", "rank": 1}], "graph": {"nodes": nodes}}  # fmt: skip
    response = httpx.post(f"{service.url}/api/v1/create_custom_loss", json=body,
                          headers={"X-API-Key": service.settings.api_key})  # fmt: skip
    assert response.status_code == 400
    assert "node 'run' (call_function os.system) is not among the operations" in response.text
