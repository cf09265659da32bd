"""The value codec of ``envhub serve``'s wire protocol, and the JSON text of its frames.

Values that are not plain JSON (messages, tool calls, error records in ``info``, tuples, numpy
arrays, dicts with non-string keys) travel through :func:`encode`/:func:`decode`, which tag them
(``{"$envhub": "Message", "value": {...}}``) so that they come back as the same types, rebuilt
by their own pydantic models. Floats keep ``inf`` and ``nan`` (JSON's ``Infinity``/``NaN``).
:func:`dumps` writes a frame; :func:`batches` gathers frames into JSON arrays.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
from pydantic import BaseModel

from envhub.types import AssistantTurn, EnvRef, ErrorRecord, FunctionCall, Message, ToolCall

TAG = "$envhub"
MODELS: dict[str, type[BaseModel]] = {
    m.__name__: m for m in (Message, ToolCall, FunctionCall, AssistantTurn, ErrorRecord, EnvRef)
}


def encode(value: Any) -> Any:
    """``value`` as JSON-ready data that :func:`decode` turns back into an equal value.

    Raises:
        TypeError: A value of a type the protocol cannot carry (say what it is, so the env can
            put something else in its ``info``).
    """
    kind = type(value)
    if kind in _PLAIN:  # the common cases first, by exact type (subclasses go the long way)
        return value
    if kind is list:
        return [v if type(v) in _PLAIN else encode(v) for v in value]
    if kind is dict:
        return _encode_dict(value)
    if kind is Message:
        # A message's fields at their defaults are left out (smaller frames); decoding restores
        # them. Not so for every model: ErrorRecord infers a missing `infra` from its type.
        return {TAG: "Message", "value": value.model_dump(mode="json", exclude_defaults=True)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value.item() if isinstance(value, np.generic) else value
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return _encode_dict(value)
    if isinstance(value, tuple):
        return {TAG: "tuple", "value": [encode(v) for v in value]}
    if isinstance(value, BaseModel) and MODELS.get(type(value).__name__) is type(value):
        compact = type(value) is Message
        value_data = value.model_dump(mode="json", exclude_defaults=compact)
        return {TAG: type(value).__name__, "value": value_data}
    if isinstance(value, np.ndarray):
        return {TAG: "ndarray", "dtype": str(value.dtype), "value": value.tolist()}
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(
        f"{type(value).__module__}.{type(value).__qualname__} cannot travel over the wire; "
        "envhub serve carries JSON values, tuples, numpy arrays and envhub's message, tool-call "
        "and error types"
    )


_PLAIN = frozenset((str, int, float, bool, type(None)))


def _encode_dict(value: dict[Any, Any]) -> Any:
    if all(type(k) is str or isinstance(k, str) for k in value) and TAG not in value:
        plain = _PLAIN
        return {k: v if type(v) in plain else encode(v) for k, v in value.items()}
    # Keys JSON cannot hold as they are (and a dict that looks like a tag): as pairs.
    return {TAG: "items", "value": [[encode(k), encode(v)] for k, v in value.items()]}


def decode(data: Any) -> Any:
    """The value that :func:`encode` turned into ``data``."""
    if isinstance(data, list):
        return [decode(v) for v in data]
    if not isinstance(data, dict):
        return data
    tag = data.get(TAG)
    if tag is None:
        return {k: decode(v) for k, v in data.items()}
    inner = data.get("value")
    if tag == "tuple":
        return tuple(decode(v) for v in inner)
    if tag == "items":
        return {_hashable(decode(k)): decode(v) for k, v in inner}
    if tag == "ndarray":
        return np.array(inner, dtype=data["dtype"])
    if tag in MODELS:
        return MODELS[tag].model_validate(inner)
    raise ValueError(f"unknown value tag {tag!r}; is the other side a newer envhub?")


def _hashable(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key


def _frame_encoder() -> Callable[[Any], str]:
    """The JSON encoding of frames, made once: compact, ASCII, ``inf`` and ``nan`` kept.

    CPython's C encoder is made once here and reused (``json.dumps`` makes one per call, about
    half the cost of a small frame's encoding). No circular-reference check: frames are built
    from :func:`encode`'s output, which has no cycles. Where the C encoder is missing, or
    takes other arguments, the plain encoder does the same work."""
    from json import encoder

    plain = json.JSONEncoder(separators=(",", ":"), check_circular=False)
    make = getattr(encoder, "c_make_encoder", None)
    if make is None:
        return plain.encode
    try:
        chunks = make(
            None, plain.default, encoder.encode_basestring_ascii, None, ":", ",", False, False, True
        )
    except TypeError:
        return plain.encode
    return lambda payload: "".join(chunks(payload, 0))


_encode_frame = _frame_encoder()


def dumps(payload: Any) -> str:
    """A frame's JSON text (compact; ``inf`` and ``nan`` kept)."""
    return _encode_frame(payload)


def batches(frames: list[str], limit: int) -> list[str]:
    """``frames`` (JSON texts) gathered into as few frames as fit in ``limit`` characters each:
    JSON arrays of them; a frame alone stays as it is. :func:`dumps` writes ASCII only, so
    characters are bytes."""
    if len(frames) <= 1:
        return frames
    out: list[str] = []
    group: list[str] = []
    size = 1
    for frame in frames:
        if group and size + len(frame) + 1 > limit:
            out.append(_array(group))
            group, size = [], 1
        group.append(frame)
        size += len(frame) + 1
    out.append(_array(group))
    return out


def _array(group: list[str]) -> str:
    return group[0] if len(group) == 1 else "[" + ",".join(group) + "]"
