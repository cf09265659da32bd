"""Bounded reading of requests: every limit holds at its edge (the value at the bound is
decoded, one past it refused) and a refused value allocates next to nothing."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import numpy as np
import pytest

from envhub.serve import protocol as p
from envhub.serve.bounds import DecodeLimits, UnreadableFrame, decode_bounded, read_frame
from envhub.types import ToolCall, assistant, user

LIMITS = DecodeLimits(max_depth=6, max_items=100, max_array_bytes=800)


def refused(data: Any, limits: DecodeLimits = LIMITS) -> p.RequestError:
    with pytest.raises(p.RequestError) as caught:
        decode_bounded(data, limits, "action")
    return caught.value


def ndarray(dtype: str, value: Any) -> dict[str, Any]:
    return {p.TAG: "ndarray", "dtype": dtype, "value": value}


def test_ordinary_values_decode_as_the_plain_decoder_does() -> None:
    values = [
        "text",
        [user("hi"), assistant("yo", tool_calls=[ToolCall.make("c1", "f", {"x": 1})])],
        {"level": (1, 2), 3: "three", (1, "a"): None},
        {"a": np.arange(6, dtype="int32").reshape(2, 3), "b": np.array(["ab", "c"])},
        float("inf"),
    ]
    for value in values:
        data = json.loads(p.dumps(p.encode(value)))
        got = decode_bounded(data, DecodeLimits(), "action")
        assert repr(got) == repr(p.decode(data))


def test_a_huge_declared_array_is_refused_before_it_is_allocated() -> None:
    frames = [
        ndarray("V268435456", [0]),  # 256 MB of raw bytes for one element
        ndarray("(67108864,)i4", [0]),  # a sub-array dtype: 256 MB per element
        ndarray("U67108864", ["x"]),  # a 256 MB string element
        ndarray("float64", [[0.0] * 50] * 2),  # 100 leaves: within items, over 800 bytes
    ]
    expected = [
        (400, "`action`: dtype 'V268435456' is not carried"),
        (400, "`action`: dtype '(67108864,)i4' is not carried"),
        (413, "`action` holds arrays of 268435456 bytes (this one: 1 x <U67108864 elements)"),
        (413, "`action` holds arrays of 800 bytes"),
    ]
    tracemalloc.start()
    try:
        errors = [refused(frame, DecodeLimits(max_array_bytes=799)) for frame in frames]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [
        (e.code, e.message[: len(m)]) for e, (_, m) in zip(errors, expected, strict=True)
    ] == expected
    assert peak < 1024 * 1024  # a refusal builds nothing


def test_each_limit_holds_at_its_edge() -> None:
    # Array bytes: 100 float64 = 800 bytes, all arrays together.
    bytes_only = DecodeLimits(max_array_bytes=800)
    at = decode_bounded([ndarray("float64", [0.5] * 99), ndarray("int64", [1])], bytes_only, "a")
    assert [a.nbytes for a in at] == [792, 8]
    over = refused([ndarray("float64", [0.5] * 99), ndarray("int64", [1, 2])], bytes_only)
    assert (over.code, over.type, over.message) == (
        413,
        p.TOO_LARGE,
        "`action` holds arrays of 808 bytes (this one: 2 x int64 elements); at most 800 "
        "(envhub serve --max-array-bytes)",
    )
    # Items: 100 in all (a list's elements, a dict's entries, an array's elements).
    assert decode_bounded({"a": list(range(99))}, LIMITS, "action") == {"a": list(range(99))}
    over = refused({"a": list(range(99)), "b": 1})
    assert (over.code, over.message) == (
        413,
        "`action` holds more than 100 items (envhub serve --max-items)",
    )
    # Depth: 6 levels.
    assert decode_bounded([[[[[["deep"]]]]]], LIMITS, "action") == [[[[[["deep"]]]]]]
    over = refused([[[[[[["deeper"]]]]]]])
    assert (over.code, over.message) == (
        413,
        "`action` holds nesting deeper than 6 levels (envhub serve --max-depth)",
    )


@pytest.mark.parametrize(
    "data, message",
    [
        ({p.TAG: "Pickle", "value": "..."}, "`action`: unknown value tag 'Pickle'"),
        (ndarray("float64", [[1.0, 2.0], [3.0]]), "`action`: setting an array element"),
        (ndarray("object", [1]), "`action`: dtype 'object' is not carried"),
        (ndarray("float64", [{"a": 1}]), "`action`: an ndarray's value holds numbers"),
        ({p.TAG: "items", "value": [[{"k": 1}, 2]]}, "`action`: unhashable type"),
        ({p.TAG: "items", "value": [1, 2]}, "`action`: an `items` value holds [key, value]"),
        ({p.TAG: "tuple", "value": "ab"}, "`action`: a 'tuple' value needs a list"),
        ({p.TAG: "Message", "value": {"role": "robot"}}, "`action`: `role`: Input should be"),
    ],
)
def test_a_malformed_value_is_a_bad_request_naming_the_field(data: Any, message: str) -> None:
    error = refused(data)
    assert (error.code, error.type) == (400, p.BAD_REQUEST)
    assert error.message.startswith(message)


@pytest.mark.parametrize(
    "frame, request_id, message",
    [
        ("nope", None, "not JSON: Expecting value: line 1 column 1 (char 0)"),
        ('{"id": "d1", "a": ' + "[" * 100_000 + "]" * 100_000 + "}", "d1", "not readable: the"),
        (b'{"id": "u1", "action": "\xff"}', "u1", "not UTF-8 (byte 24: invalid start byte)"),
        ('{"op": "step", "id": "late"' + "[", None, "not JSON: Expecting"),
        (
            '{"id": "n1", "a": ' + "1" * 4301 + "}",
            "n1",
            "not readable: Exceeds the limit (4300 digits) for integer string conversion: value "
            "has 4301 digits",
        ),
    ],
)
def test_an_unreadable_frame_names_why_and_its_id_when_it_leads(
    frame: str | bytes, request_id: str | None, message: str
) -> None:
    with pytest.raises(UnreadableFrame) as caught:
        read_frame(frame)
    assert (caught.value.code, caught.value.request_id) == (400, request_id)
    assert caught.value.message.startswith(message)


def test_numbers_up_to_4300_digits_are_read() -> None:
    assert read_frame('{"n": ' + "9" * 4300 + "}") == {"n": int("9" * 4300)}
