"""Reading untrusted requests within bounds: a frame's JSON, and the values in it.

The server reads every frame with :func:`read_frame` and every value a request carries (a step's
action, ``create``'s env args, ``reset``'s options) with :func:`decode_bounded`, never with the
plain :func:`~envhub.serve.protocol.decode`: a value's nesting depth, its number of items
(list elements, dict entries, array elements, all counted together) and the bytes of the numpy
arrays it declares are checked *before* anything is built, so that a frame of a hundred bytes
cannot make the server allocate gigabytes (an array whose declared dtype is enormous), nor can a
deeply nested or odd document crash it. What breaks a bound is refused with a 413 ``too_large``
error naming the field and the bound; what is malformed, with a 400 ``bad_request``; both on the
request's own id.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import ValidationError

from envhub.serve.protocol import (
    BAD_REQUEST,
    MAX_ARRAY_BYTES,
    MAX_DEPTH,
    MAX_ITEMS,
    MODELS,
    TAG,
    TOO_LARGE,
    RequestError,
)


@dataclass(frozen=True)
class DecodeLimits:
    """Bounds on one request's decoded values (each value field counted on its own)."""

    max_depth: int = MAX_DEPTH
    """Nesting levels (lists, dicts, tagged values) a value may have."""
    max_items: int = MAX_ITEMS
    """List elements, dict entries and array elements a value may hold, all together."""
    max_array_bytes: int = MAX_ARRAY_BYTES
    """Bytes the numpy arrays of a value may take once built, all together."""


_LEADING_ID = re.compile(r'\s*\{\s*"id"\s*:\s*"([^"\\]{1,200})"')
"""A frame's top-level id, when it is the first key (as every envhub client writes it): read
from frames that do not parse, to answer them on their own id."""


def read_frame(frame: str | bytes) -> Any:
    """The frame's JSON value. A number of more than 4,300 digits (Python's limit: converting a
    long decimal costs time quadratic in its length) makes the frame unreadable.

    Raises:
        UnreadableFrame: 400 ``bad_request``: not UTF-8, not JSON, nested deeper than the parser
            goes, or a number too long; with the frame's id when it starts with one.
    """
    try:
        return json.loads(frame)
    except UnicodeDecodeError as e:
        why = f"not UTF-8 (byte {e.start}: {e.reason})"
    except json.JSONDecodeError as e:
        why = f"not JSON: {e}"
    except RecursionError:
        why = "not readable: the JSON nests deeper than the server's parser goes"
    except ValueError as e:  # another refusal of the parser: a number too long
        why = f"not readable: {str(e).partition(';')[0]}"
    raise UnreadableFrame(why, leading_id(frame))


class UnreadableFrame(RequestError):
    """A frame that does not parse; :attr:`request_id` is its id if one could be read."""

    def __init__(self, message: str, request_id: str | None) -> None:
        super().__init__(400, BAD_REQUEST, message)
        self.request_id = request_id


def leading_id(frame: str | bytes) -> str | None:
    """The id of a frame whose text starts with ``{"id": "..."`` (``None`` otherwise)."""
    head = frame[:300]
    if isinstance(head, bytes):
        head = head.decode("utf-8", "replace")
    match = _LEADING_ID.match(head)
    return match.group(1) if match else None


def decode_bounded(data: Any, limits: DecodeLimits, field: str) -> Any:
    """:func:`~envhub.serve.protocol.decode` of the request field ``field``, checked against
    ``limits`` before anything is built.

    Raises:
        RequestError: 413 ``too_large`` past a bound, 400 ``bad_request`` when malformed (an
            unknown tag, an array that numpy cannot build, a model's fields wrong).
    """
    if type(data) in _SCALARS:  # a step's text: nothing to walk
        return data
    budget = _Budget(limits, field)
    try:
        return budget.decode(data, 1)
    except RequestError:
        raise
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "value"
        raise budget.malformed(f"`{where}`: {first['msg']}") from None
    except (ValueError, TypeError, OverflowError) as e:
        raise budget.malformed(str(e)) from None


_SCALARS = (str, int, float, bool, type(None))
_ARRAY_KINDS = "biufcUS"
"""numpy dtype kinds an array may have: bool, ints, floats, complex, str and bytes (not objects,
records, sub-arrays, raw ``void`` bytes or dates)."""


class _Budget:
    """What is left of one value's bounds while it is walked."""

    def __init__(self, limits: DecodeLimits, field: str) -> None:
        self.limits, self.field = limits, field
        self.items = limits.max_items
        self.array_bytes = limits.max_array_bytes

    def decode(self, data: Any, depth: int) -> Any:
        if type(data) in _SCALARS:
            return data
        self.enter(data, depth)
        if type(data) is list:
            self.charge(len(data))
            scalars = _SCALARS
            return [v if type(v) in scalars else self.decode(v, depth + 1) for v in data]
        self.charge(len(data))
        tag = data.get(TAG)
        if tag is None:
            return {k: self.decode(v, depth + 1) for k, v in data.items()}
        inner = data.get("value")
        if tag == "ndarray":
            return self.array(data.get("dtype"), inner, depth + 1)
        if tag == "tuple":
            return tuple(self.decode(v, depth + 1) for v in self.listed(inner, tag))
        if tag == "items":
            pairs = [self.pair(item, depth + 1) for item in self.listed(inner, tag)]
            return dict(pairs)
        model = MODELS.get(tag) if isinstance(tag, str) else None
        if model is None:
            raise self.malformed(f"unknown value tag {tag!r}; is the client a newer envhub?")
        self.walk(inner, depth + 1)
        return model.model_validate(inner)

    def pair(self, item: Any, depth: int) -> tuple[Any, Any]:
        if type(item) is not list or len(item) != 2:
            raise self.malformed("an `items` value holds [key, value] pairs")
        key = self.decode(item[0], depth + 1)
        return (tuple(key) if isinstance(key, list) else key), self.decode(item[1], depth + 1)

    def walk(self, data: Any, depth: int) -> None:
        """Check ``data`` (a model's fields, validated by the model) without building anything."""
        if type(data) in _SCALARS:
            return
        self.enter(data, depth)
        self.charge(len(data))
        for value in data if type(data) is list else data.values():
            self.walk(value, depth + 1)

    def array(self, dtype_name: Any, inner: Any, depth: int) -> np.ndarray:
        dtype = self.dtype(dtype_name)
        count, longest = self.leaves(inner, depth)
        itemsize = dtype.itemsize
        if itemsize == 0:  # "U"/"S": as wide as the longest element
            itemsize = max(longest, 1) * (4 if dtype.kind == "U" else 1)
        size = count * itemsize
        if size > self.array_bytes:
            raise self.too_large(
                f"arrays of {self.limits.max_array_bytes - self.array_bytes + size} bytes (this "
                f"one: {count} x {dtype} elements); at most {self.limits.max_array_bytes}",
                "--max-array-bytes",
            )
        self.array_bytes -= size
        return np.array(inner, dtype=dtype)

    def dtype(self, name: Any) -> np.dtype:
        if not isinstance(name, str) or len(name) > 32:
            raise self.malformed("an ndarray needs a `dtype` name such as 'float64'")
        try:
            dtype = np.dtype(name)
        except (TypeError, ValueError):
            raise self.malformed(f"{name!r} is not a numpy dtype") from None
        if dtype.kind not in _ARRAY_KINDS or dtype.fields is not None or dtype.subdtype:
            raise self.malformed(
                f"dtype {name!r} is not carried; arrays of bool, int, float, complex, str or "
                "bytes are"
            )
        return dtype

    def leaves(self, data: Any, depth: int) -> tuple[int, int]:
        """How many scalars the nested lists ``data`` hold, and the longest text among them."""
        if type(data) in _SCALARS:
            self.charge(1)
            return 1, _width(data)
        if type(data) is not list:
            raise self.malformed("an ndarray's value holds numbers, strings and lists of them")
        self.enter(data, depth)
        count = longest = 0
        for item in data:
            n, width = self.leaves(item, depth + 1)
            count, longest = count + n, max(longest, width)
        return count, longest

    def listed(self, inner: Any, tag: str) -> list[Any]:
        if type(inner) is not list:
            raise self.malformed(f"a {tag!r} value needs a list")
        return inner

    def enter(self, data: Any, depth: int) -> None:
        """Refuse ``data`` (a container at ``depth``) if it is too deep or not a JSON value."""
        if type(data) not in (list, dict):
            raise self.malformed(f"a {type(data).__name__} is not a JSON value")
        if depth > self.limits.max_depth:
            raise self.too_large(
                f"nesting deeper than {self.limits.max_depth} levels", "--max-depth"
            )

    def charge(self, n: int) -> None:
        self.items -= n
        if self.items < 0:
            raise self.too_large(f"more than {self.limits.max_items} items", "--max-items")

    def too_large(self, what: str, flag: str) -> RequestError:
        return RequestError(413, TOO_LARGE, f"`{self.field}` holds {what} (envhub serve {flag})")

    def malformed(self, why: str) -> RequestError:
        return RequestError(400, BAD_REQUEST, f"`{self.field}`: {why}")


def _width(scalar: Any) -> int:
    """Characters the scalar takes in a ``str`` array (an upper bound for numbers)."""
    if isinstance(scalar, str):
        return len(scalar)
    if isinstance(scalar, int):
        return scalar.bit_length() // 3 + 2
    return 32
