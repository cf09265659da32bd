"""Custom losses run on the service: the Tinker SDK's ``create_custom_loss``, uploaded.

The SDK traces a per-datum loss ``fn(logprobs, *inputs) -> (loss, metrics)`` with torch.fx
and sends its graph as plain data (``CustomLossGraph``: nodes naming functions by their
qualified names, arguments as JSON). Nothing in it is code: :func:`build` rebuilds the graph
from the allow-lists below (tensor arithmetic, reductions, comparisons and shapes from
``torch``, ``torch.nn.functional``, ``math`` and Python's operators) and refuses any other
node, whatever the SDK checked on its side. ``forward_backward`` with ``loss_fn="custom"``
and ``loss_fn_config={"loss_id": ...}`` then runs the loss on each datum in the same pass as
the forward, so a custom loss costs one request, as a built-in one does.

What it does not protect against: a loss that is slow or large by design (a huge
``torch.zeros``); it runs on the trainer thread like any request.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from envhub.errors import ConfigError

_MATH_OPS = frozenset({
    "abs", "add", "sub", "mul", "div", "neg", "pow", "exp", "exp2", "expm1", "log", "log1p",
    "log2", "log10", "sqrt", "rsqrt", "square", "reciprocal", "sign", "sigmoid", "tanh",
    "relu", "clamp", "clip", "clamp_min", "clamp_max", "minimum", "maximum", "where",
    "floor", "ceil", "round", "trunc", "isfinite", "isnan", "nan_to_num", "masked_fill",
    "logical_and", "logical_or", "logical_not", "lt", "le", "gt", "ge", "eq", "ne",
    "sum", "mean", "prod", "cumsum", "logsumexp", "softmax", "log_softmax", "std", "var",
    "min", "max", "amin", "amax", "argmin", "argmax", "norm", "matmul", "dot", "einsum",
    "gather", "index_select", "reshape", "flatten", "squeeze", "unsqueeze", "transpose",
    "stack", "cat", "zeros_like", "ones_like", "full_like", "numel", "diff", "topk", "sort",
})  # fmt: skip
"""Functions of ``torch`` (and methods of tensors) a loss may call."""

_METHODS = _MATH_OPS | frozenset({
    "detach", "float", "double", "to", "type_as", "size", "dim", "view", "view_as",
    "expand", "expand_as", "contiguous", "clone", "t",
})  # fmt: skip
"""Tensor methods a loss may call: no in-place ones, none that leave torch."""

_FUNCTIONAL = frozenset({
    "logsigmoid", "log_sigmoid", "softplus", "relu", "sigmoid", "silu", "gelu", "elu",
    "softmax", "log_softmax", "kl_div", "mse_loss", "l1_loss", "huber_loss",
    "smooth_l1_loss", "nll_loss", "cross_entropy", "binary_cross_entropy_with_logits",
    "normalize", "pad",
})  # fmt: skip
"""Functions of ``torch.nn.functional`` (or their ``torch._C._nn`` kernels)."""

_OPERATORS = frozenset({
    "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg", "pos", "abs",
    "matmul", "getitem", "lt", "le", "gt", "ge", "eq", "ne", "and_", "or_", "xor", "invert",
})  # fmt: skip
_ATTRIBUTES = frozenset({"shape", "dtype", "ndim", "T"})
"""What ``getattr`` may read off a tensor."""


def _function(target: str) -> Any:
    """The callable ``target`` names, if an allow-list holds it; else ``None``."""
    module, _, name = target.rpartition(".")
    if module == "torch" and name in _MATH_OPS:
        return getattr(torch, name)
    if module in ("torch.nn.functional", "torch._C._nn") and name in _FUNCTIONAL:
        return getattr(torch.nn.functional, name, None) or getattr(torch._C._nn, name, None)
    if module == "operator" and name in _OPERATORS:
        return getattr(operator, name)
    if module == "math" and not name.startswith("_") and callable(getattr(math, name, None)):
        return getattr(math, name)
    if target in ("getattr", "builtins.getattr"):
        return _getattr
    return None


def _getattr(value: Any, name: str) -> Any:
    if name not in _ATTRIBUTES:
        raise ConfigError(f"a custom loss may read {', '.join(sorted(_ATTRIBUTES))}, not {name!r}")
    return getattr(value, name)


@dataclass(frozen=True)
class Node:
    """One step of a rebuilt loss: call ``fn`` (or method ``method``) on decoded arguments."""

    name: str
    fn: Any
    method: str | None
    args: Any
    kwargs: Any


@dataclass(frozen=True)
class CustomLoss:
    """A loss rebuilt from the allow-lists: ``(logprobs, *inputs) -> (loss, metrics)``."""

    name: str
    inputs: tuple[tuple[str, int], ...]
    """``logprobs`` then the ``loss_fn_inputs`` keys it reads, each with its rank."""
    placeholders: tuple[str, ...]
    nodes: tuple[Node, ...]
    output: Any

    def __call__(self, *values: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """Run the loss on one datum's tensors."""
        env: dict[str, Any] = dict(zip(self.placeholders, values, strict=True))
        for node in self.nodes:
            args, kwargs = _resolve(node.args, env), _resolve(node.kwargs, env)
            if node.method is not None:
                env[node.name] = getattr(args[0], node.method)(*args[1:], **kwargs)
            else:
                env[node.name] = node.fn(*args, **kwargs)
        loss, metrics = _resolve(self.output, env)
        return loss, metrics

    def apply(self, logprobs: list[Tensor], data: list[Any]) -> tuple[Tensor, dict[str, float]]:
        """The summed loss over ``data`` (wire datums) and the metrics, each ``:sum`` summed
        and ``:mean`` averaged over the datums, as the SDK combines them.

        Raises:
            ConfigError: A datum lacks an input, or the loss fails or returns no scalar.
        """
        total: Tensor | None = None
        sums: dict[str, float] = {}
        for i, (lp, datum) in enumerate(zip(logprobs, data, strict=True)):
            values = [lp] + [_input(datum, name, rank, i) for name, rank in self.inputs[1:]]
            try:
                loss, metrics = self(*values)
            except (RuntimeError, TypeError, ValueError, IndexError) as e:
                raise ConfigError(f"custom loss {self.name!r} failed on datum {i}: {e}") from e
            if not isinstance(loss, Tensor) or loss.ndim != 0:
                raise ConfigError(f"custom loss {self.name!r} must return a scalar loss")
            total = loss if total is None else total + loss
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + float(torch.as_tensor(value).detach())
        assert total is not None
        return total, {k: v / len(data) if k.endswith(":mean") else v for k, v in sums.items()}


def _input(datum: Any, name: str, rank: int, index: int) -> Tensor:
    array = datum.inputs.get(name)
    if array is None:
        raise ConfigError(f"datum {index} has no loss_fn_inputs[{name!r}], which the loss reads")
    array = array.reshape(()) if rank == 0 and array.size == 1 else array
    if array.ndim != rank:
        raise ConfigError(f"loss_fn_inputs[{name!r}] of datum {index} is not of rank {rank}")
    return torch.from_numpy(np.array(array, dtype=np.int64 if array.dtype.kind in "iu" else None))


def _resolve(value: Any, env: dict[str, Any]) -> Any:
    """Decoded arguments with each node reference replaced by that node's value."""
    if isinstance(value, _Ref):
        return env[value.name]
    if isinstance(value, list):
        return [_resolve(v, env) for v in value]
    if isinstance(value, tuple):
        return tuple(_resolve(v, env) for v in value)
    if isinstance(value, dict):
        return {k: _resolve(v, env) for k, v in value.items()}
    if isinstance(value, slice):
        return slice(*(_resolve(v, env) for v in (value.start, value.stop, value.step)))
    return value


@dataclass(frozen=True)
class _Ref:
    name: str


def build(name: str, inputs: list[dict], graph: dict) -> CustomLoss:
    """Rebuild an uploaded loss (a ``CreateCustomLossRequest``'s ``name``, ``inputs`` and
    ``graph``) from the allow-lists.

    Raises:
        ConfigError: A node outside the allow-lists, a reference to a later node, or inputs
            that do not match the graph's parameters; the message names the node.
    """
    declared = tuple((str(i["name"]), int(i["rank"])) for i in inputs)
    if not declared or declared[0][0] != "logprobs":
        raise ConfigError(f"custom loss {name!r}: its first input must be logprobs")
    placeholders: list[str] = []
    nodes: list[Node] = []
    seen: set[str] = set()
    output = None
    for raw in graph.get("nodes", []):
        node_name, op, target = raw["name"], raw["op"], raw["target"]
        if output is not None:
            raise ConfigError(f"custom loss {name!r}: node {node_name!r} follows the output")
        args = _decode(raw.get("args", []), seen, name)
        kwargs = _decode({"dict": raw.get("kwargs", {})}, seen, name)
        if op == "placeholder":
            placeholders.append(node_name)
        elif op == "output":
            output = args[0]
        elif op == "call_method" and target in _METHODS:
            nodes.append(Node(node_name, None, target, args, kwargs))
        elif op == "call_function" and (fn := _function(target)) is not None:
            nodes.append(Node(node_name, fn, None, args, kwargs))
        else:
            raise ConfigError(
                f"custom loss {name!r}: node {node_name!r} ({op} {target}) is not among the "
                "operations the service runs (tensor math from torch, torch.nn.functional, "
                "math and Python's operators)"
            )
        seen.add(node_name)
    if output is None or len(placeholders) != len(declared):
        raise ConfigError(
            f"custom loss {name!r}: the graph takes {len(placeholders)} inputs and declares "
            f"{len(declared)}, or returns nothing"
        )
    return CustomLoss(name, declared, tuple(placeholders), tuple(nodes), output)


def _decode(value: Any, seen: set[str], loss: str) -> Any:
    """The SDK's argument encoding (``CustomLossNode.args``) as Python values."""
    if isinstance(value, list):
        return [_decode(v, seen, loss) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) != 1:
        raise ConfigError(f"custom loss {loss!r}: an argument {value!r} is not encoded")
    (kind, inner), = value.items()  # fmt: skip
    if kind == "ref":
        if inner not in seen:
            raise ConfigError(f"custom loss {loss!r} refers to {inner!r} before it is computed")
        return _Ref(inner)
    if kind == "tuple":
        return tuple(_decode(v, seen, loss) for v in inner)
    if kind == "dict":
        return {str(k): _decode(v, seen, loss) for k, v in inner.items()}
    if kind == "slice":
        return slice(*(_decode(v, seen, loss) for v in inner))
    if kind == "ellipsis":
        return Ellipsis
    if kind == "float":
        return float(inner)
    if kind in ("dtype", "layout", "memory_format"):
        constant = getattr(torch, str(inner), None)
        kinds = {"dtype": torch.dtype, "layout": torch.layout, "memory_format": torch.memory_format}
        if not isinstance(constant, kinds[kind]):
            raise ConfigError(f"custom loss {loss!r}: no torch {kind} {inner!r}")
        return constant
    if kind == "device":
        return torch.device(str(inner))
    raise ConfigError(f"custom loss {loss!r}: an argument of kind {kind!r} is not served")
