"""The wire types and the value codec: everything an env returns comes back as the same value."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from envhub.serve import protocol as p
from envhub.types import AssistantTurn, EnvRef, ErrorRecord, Message, ToolCall, assistant, user


def round_trip(value: object) -> object:
    return p.decode(json.loads(p.dumps(p.encode(value))))


@pytest.mark.parametrize(
    "value",
    [
        [user("hi"), Message(role="tool", content="3", tool_call_id="c1", name="calculate")],
        assistant("x", [ToolCall.make("c1", "calculate", {"expression": "1+2"})]),
        AssistantTurn(message=assistant("ok"), num_tokens=3, finish_reason="length"),
        {"errors": [ErrorRecord(stage="reward:x", type="KeyError", message="k", infra=False)]},
        {"range": (0.0, 1.0), "nested": [(1, "a"), {"b": None}], "flag": True},
        {1: "int key", (2, 3): "tuple key"},
        {"$envhub": "looks like a tag", "value": 1},
        EnvRef(name="calculator", version="0.1.0", commit="a" * 40),
    ],
)
def test_values_come_back_equal_and_of_the_same_types(value: object) -> None:
    back = round_trip(value)
    assert back == value
    assert type(back) is type(value)


def test_an_error_record_keeps_its_infra_flag_even_against_the_types_name() -> None:
    # ErrorRecord infers `infra` from the type name when absent: it must travel explicitly.
    record = ErrorRecord(stage="env.step", type="ConnectionError", message="m", infra=False)
    assert round_trip(record).infra is False


def test_floats_keep_infinity_and_numpy_values_become_python_or_arrays() -> None:
    back = round_trip({"low": -math.inf, "x": np.float32(0.5), "n": np.int64(3), "b": np.bool_(1)})
    assert back == {"low": -math.inf, "x": 0.5, "n": 3, "b": True}
    assert [type(v) for v in back.values()] == [float, float, int, bool]
    array = round_trip(np.arange(6, dtype=np.int16).reshape(2, 3))
    assert array.dtype == np.int16 and array.tolist() == [[0, 1, 2], [3, 4, 5]]


def test_a_value_the_wire_cannot_carry_is_named() -> None:
    with pytest.raises(TypeError, match=r"builtins\.set cannot travel over the wire"):
        p.encode({"seen": {1, 2}})


@pytest.mark.parametrize(
    "payload, message",
    [
        ([1, 2], "a frame must be a JSON object"),
        ({"id": "1", "op": "jump"}, "unknown op 'jump'; expected one of create, reset, step"),
        ({"id": "1", "op": "step", "session": "s"}, "step request: `action`: Field required"),
        ({"op": "reset", "session": "s"}, "reset request: `id`: Field required"),
        ({"id": "1", "op": "reset", "session": "s", "seed": "x"}, "`seed`: Input should be"),
        ({"id": "1", "op": "info", "session": "s", "extra": 1}, "`extra`: Extra inputs"),
    ],
)
def test_malformed_requests_are_refused_with_what_is_wrong(payload: object, message: str) -> None:
    with pytest.raises(p.RequestError) as caught:
        p.parse_request(payload)
    assert (caught.value.code, caught.value.type) == (400, p.BAD_REQUEST)
    assert message in caught.value.message


def test_a_valid_request_parses_to_its_op_type() -> None:
    request = p.parse_request({"id": "7", "op": "reset", "session": "s", "seed": 3})
    assert request == p.ResetRequest(id="7", op="reset", session="s", seed=3)
