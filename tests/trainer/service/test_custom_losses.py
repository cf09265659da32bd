"""Uploaded custom losses rebuilt from their graphs (no model): the SDK's own tracing and
encoding in, the same values and gradients out as the Python function."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tinker")

from tinker.lib.public_interfaces.custom_loss import encode_graph, trace_loss  # noqa: E402

from envhub.errors import ConfigError  # noqa: E402
from envhub.trainer.service.custom_losses import build  # noqa: E402
from envhub.trainer.service.wire import Datum  # noqa: E402


def clipped(logprobs, advantages, weights, scale):  # noqa: ANN001, ANN201 - traced by torch.fx
    """Many of the allowed operations at once: methods, functions, operators, slicing."""
    ratio = torch.exp(logprobs - logprobs.detach() * 0.9)
    bounded = torch.clamp(ratio, 0.8, 1.2)
    surrogate = torch.minimum(ratio * advantages, bounded * advantages)
    count = logprobs.shape[0]
    extra = torch.nn.functional.logsigmoid(logprobs).mean() + math.log(2.0)
    chosen = torch.where(advantages > 0, ratio, bounded).sum() / count
    head = (weights * logprobs).float()[..., :3].sum(dim=-1, keepdim=False)
    loss = -(surrogate.sum() + extra + chosen + head) * scale
    return loss, {"custom/ratio:mean": ratio.mean(), "custom/count:sum": logprobs.sum() * 0 + 1}


def rebuilt(fn, ranks: dict[str, int]):  # noqa: ANN001, ANN201
    handle = trace_loss(fn, ranks, "session")
    inputs = [i.model_dump() for i in handle.inputs]
    return build(handle.name, inputs, encode_graph(handle).model_dump())


def test_a_rebuilt_loss_computes_the_functions_values_and_gradients() -> None:
    loss = rebuilt(clipped, {"logprobs": 1, "advantages": 1, "weights": 1, "scale": 0})
    rows = [np.array([-1.0, -0.5, -2.0, -0.1], np.float32), np.array([-0.3, -3.0], np.float32)]
    advantages = np.array([1.0, -1.0, 0.5, 2.0], np.float32)
    data = [Datum([1] * len(lp), {"advantages": advantages[: len(lp)],
                                  "weights": np.ones(len(lp), np.float32),
                                  "scale": np.array([0.5], np.float32)})
            for lp in rows]  # fmt: skip
    served = [torch.tensor(lp, requires_grad=True) for lp in rows]
    total, metrics = loss.apply(served, data)
    total.backward()
    expected_total = 0.0
    for lp, d, got in zip(rows, data, served, strict=True):
        mine = torch.tensor(lp, requires_grad=True)
        inputs = [torch.from_numpy(d.inputs[k]) for k in ("advantages", "weights")]
        value, _ = clipped(mine, *inputs, torch.tensor(0.5))
        value.backward()
        expected_total += float(value.detach())
        assert got.grad.tolist() == pytest.approx(mine.grad.tolist(), abs=1e-6)
    assert float(total.detach()) == pytest.approx(expected_total, abs=1e-6)
    assert metrics["custom/count:sum"] == 2.0
    ratios = [float(torch.exp(torch.tensor(lp) * 0.1).mean()) for lp in rows]
    assert metrics["custom/ratio:mean"] == pytest.approx(sum(ratios) / 2, rel=1e-6)


def test_a_graph_outside_the_lists_or_out_of_order_is_refused() -> None:
    def nodes(*middle: dict) -> dict:
        return {"nodes": [{"op": "placeholder", "name": "logprobs", "target": "logprobs"}, *middle,
                          {"op": "output", "name": "output", "target": "output",
                           "args": [{"tuple": [{"ref": "x"}, {"dict": {}}]}]}]}  # fmt: skip

    inputs = [{"name": "logprobs", "rank": 1}]
    with pytest.raises(ConfigError, match=r"node 'x' \(call_method backward\) is not among"):
        build("f", inputs, nodes({"op": "call_method", "name": "x", "target": "backward",
                                  "args": [{"ref": "logprobs"}]}))  # fmt: skip
    with pytest.raises(ConfigError, match="refers to 'later' before it is computed"):
        build("f", inputs, nodes({"op": "call_function", "name": "x", "target": "torch.exp",
                                  "args": [{"ref": "later"}]}))  # fmt: skip
    with pytest.raises(ConfigError, match="may read T, dtype, ndim, shape, not 'grad_fn'"):
        loss = build("f", inputs, nodes({"op": "call_function", "name": "x", "target": "getattr",
                                         "args": [{"ref": "logprobs"}, "grad_fn"]}))  # fmt: skip
        loss(torch.zeros(2))
