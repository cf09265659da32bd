"""The Tinker SDK's protobuf bodies, read and written with the SDK's own message classes.

The ``tinker`` client (0.38) sends ``forward_backward`` as a protobuf
``ForwardBackwardRequest`` and reads ``ForwardBackwardOutput`` and ``SampleResponse`` results
only as protobuf (``Accept: application/x-protobuf``); every other route is JSON. The message
classes come from ``tinker.proto.tinker_public_pb2``, the schema the SDK ships, so the server
and the client cannot disagree about a field. Tensors travel as raw little-endian bytes;
token chunks as int32.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from envhub.errors import ConfigError

PROTO = "application/x-protobuf"
"""The content type of the protobuf bodies."""


def _pb() -> Any:
    try:
        from tinker.proto import tinker_public_pb2
    except ImportError as e:  # the service's extra brings it
        from envhub.errors import MissingDependencyError

        raise MissingDependencyError.for_extra("tinker", "service") from e
    return tinker_public_pb2


@dataclass
class Datum:
    """One training example as the service computes on it."""

    tokens: list[int]
    """The model input's tokens (text chunks only)."""
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    """``loss_fn_inputs`` by name (``target_tokens``, ``weights``, ``logprobs``,
    ``advantages``), each dense."""


@dataclass
class ForwardRequest:
    """A decoded ``/api/v1/forward_backward`` body."""

    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: dict[str, float | str]
    forward_only: bool
    data: list[Datum]


def _numpy_dtype(pb: Any, dtype: int) -> np.dtype:
    table = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}
    if dtype not in table:
        raise ConfigError(f"unsupported tensor dtype {dtype} in a forward_backward request")
    return np.dtype(table[dtype])


def _tensor(pb: Any, msg: Any) -> np.ndarray:
    """A proto ``Tensor`` as a dense array (a sparse CSR one is densified)."""
    dtype = _numpy_dtype(pb, msg.dtype)
    shape = list(msg.shape)
    if msg.HasField("sparse_csr"):
        csr = msg.sparse_csr
        values = np.frombuffer(csr.values, dtype=dtype)
        crow = np.frombuffer(csr.crow_indices, dtype=np.int64)
        cols = np.frombuffer(csr.col_indices, dtype=np.int64)
        dense = np.zeros(shape, dtype=dtype)
        for row in range(len(crow) - 1):
            dense[row, cols[crow[row] : crow[row + 1]]] = values[crow[row] : crow[row + 1]]
        return dense
    array = np.frombuffer(msg.dense, dtype=dtype)
    return array.reshape(shape) if shape else array


def _tokens(pb: Any, chunks: Any) -> list[int]:
    tokens: list[int] = []
    for chunk in chunks:
        if chunk.WhichOneof("chunk") != "encoded_text":
            raise ConfigError("only text chunks are served (no images or audio)")
        tokens.extend(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist())
    return tokens


def read_forward_request(body: bytes) -> ForwardRequest:
    """Decode a protobuf ``ForwardBackwardRequest`` body."""
    pb = _pb()
    msg = pb.ForwardBackwardRequest()
    msg.ParseFromString(body)
    config: dict[str, float | str] = dict(msg.loss_fn_config)
    for key, value in msg.loss_fn_config_v2.items():  # v2 wins where both are set
        config[key] = value.text if value.WhichOneof("value") == "text" else value.number
    data = [
        Datum(
            _tokens(pb, d.model_input),
            {name: _tensor(pb, t) for name, t in d.loss_fn_inputs.items()},
        )
        for d in msg.data
    ]
    return ForwardRequest(msg.model_id, msg.seq_id, msg.loss_fn, config, msg.forward_only, data)


def forward_output(outputs: list[dict[str, np.ndarray]], metrics: dict[str, float]) -> bytes:
    """A ``ForwardBackwardOutput`` body: per datum, float32 arrays (``logprobs``,
    ``elementwise_loss``), batched one field at a time with byte offsets per datum.

    A record's arrays share their shape after the first axis (``[T]``, or ``[T, K]`` with
    2-D targets), so each run of datums with the same trailing shape is one record; the SDK
    reads the records one after the other."""
    pb = _pb()
    msg = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", metrics=metrics)
    for run in _runs_by_trailing_shape(outputs):
        record = msg.loss_fn_outputs.add(num_datums=len(run))
        for name in run[0]:
            arrays = [np.ascontiguousarray(o[name], dtype=np.float32) for o in run]
            offsets = np.cumsum([0] + [a.nbytes for a in arrays], dtype=np.int64)
            batched = record.fields[name]
            batched.dtype = pb.DTYPE_FLOAT32
            batched.data = b"".join(a.tobytes() for a in arrays)
            batched.offsets = offsets.tobytes()
            batched.trailing_shape.extend(arrays[0].shape[1:])
    return msg.SerializeToString()


def _runs_by_trailing_shape(outputs: list[dict[str, np.ndarray]]) -> list[list[dict]]:
    """``outputs`` cut into consecutive runs whose arrays have the same trailing shapes."""
    runs: list[list[dict]] = []
    last = None
    for output in outputs:
        shapes = tuple(np.shape(a)[1:] for a in output.values())
        if not runs or shapes != last:
            runs.append([])
        runs[-1].append(output)
        last = shapes
    return runs


@dataclass
class Sequence:
    """One sampled completion."""

    tokens: list[int]
    logprobs: list[float]
    stop_reason: str
    """``stop`` (a stop token or string, or EOS) or ``length``."""


def sample_output(sequences: list[Sequence], prompt_logprobs: list[float] | None = None) -> bytes:
    """A ``SampleResponse`` body: int32 tokens and float32 logprobs per sequence, and the
    prompt's float32 logprobs when asked for (NaN where there is none)."""
    pb = _pb()
    reasons = {"stop": pb.STOP_REASON_STOP, "length": pb.STOP_REASON_LENGTH}
    msg = pb.SampleResponse()
    if prompt_logprobs is not None:
        msg.prompt_logprobs = np.asarray(prompt_logprobs, dtype=np.float32).tobytes()
    for s in sequences:
        msg.sequences.add(
            stop_reason=reasons[s.stop_reason],
            tokens=np.asarray(s.tokens, dtype=np.int32).tobytes(),
            logprobs=np.asarray(s.logprobs, dtype=np.float32).tobytes(),
        )
    return msg.SerializeToString()
