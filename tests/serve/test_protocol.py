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


def test_the_clients_request_dicts_are_the_models_dumps() -> None:
    step = p.step_request("7", "s-1", assistant("hi"), 4)
    assert step == p.StepRequest(
        id="7", op="step", session="s-1", seq=4, action=p.encode(assistant("hi"))
    ).model_dump(mode="json")
    assert p.parse_request(json.loads(p.dumps(step))).action == p.encode(assistant("hi"))
    reset = p.reset_request("8", "s-1", 3, {"level": (1, 2)}, 5)
    assert reset == p.ResetRequest(
        id="8", op="reset", session="s-1", seq=5, seed=3, options=p.encode({"level": (1, 2)})
    ).model_dump(mode="json")
    assert p.decode(p.parse_request(reset).options) == {"level": (1, 2)}


def model_step(*values: object) -> dict[str, object]:
    names = ("observation", "reward", "terminated", "truncated", "info", "remaining_tokens")
    fields = dict(zip(names, values, strict=False))
    return p.StepResult(**fields, state=values[6]).model_dump(mode="json")


STATE = p.episode_state(1, [], True, 2, 40, {"tool_calls": 2}, None, {"exact": 1.0})


@pytest.mark.parametrize(
    "values",
    [
        ([], 1.0, True, False, {}, None, None),
        (["obs"], 0, False, True, {"x": [1]}, 12, STATE),
        ([], -math.inf, False, False, {}, 0, None),
    ],
)
def test_a_plain_step_result_is_built_as_the_model_dumps_it(values: tuple[object, ...]) -> None:
    built = p.step_result(*values)
    assert built == model_step(*values)
    assert [type(v) for v in built.values()] == [type(v) for v in model_step(*values).values()]


def test_other_step_values_go_through_the_model_as_before() -> None:
    # The model converts numpy and int values (np.int64 3 -> 3.0, 1 -> True) or refuses them.
    converted = p.step_result([], np.int64(3), 1, np.bool_(False), {}, None, None)
    assert converted == model_step([], np.int64(3), 1, np.bool_(False), {}, None, None)
    assert (converted["reward"], converted["terminated"], converted["truncated"]) == (
        3.0,
        True,
        False,
    )
    assert type(converted["reward"]) is float and type(converted["terminated"]) is bool
    with pytest.raises(ValueError, match="reward"):
        p.step_result([], "high", False, False, {}, None, None)
    with pytest.raises(ValueError, match="remaining_tokens"):
        p.step_result([], 1.0, False, False, {}, "many", None)


def test_an_episode_state_is_the_models_dump_and_odd_counters_go_through_the_model() -> None:
    fields = (2, [{"x": 1}], False, 3, 50, {"tool_calls": 1, "rate": 0.5}, "done", {"a": 1.0})
    assert p.episode_state(*fields) == p.EpisodeView(
        **dict(zip(p.EpisodeView.model_fields, fields, strict=True))
    ).model_dump(mode="json")
    odd = p.episode_state(0, [], False, 1, 5, {"tool_calls": np.int64(2)}, None, {})
    assert odd["metrics"] == {"tool_calls": 2.0}  # as the model always converted it
    assert type(odd["metrics"]["tool_calls"]) is float
    with pytest.raises(ValueError, match="turn"):
        p.episode_state(0, [], False, "one", 5, {}, None, {})


def test_frames_are_compact_and_keep_infinity_and_nan() -> None:
    text = p.dumps({"a": [1, 2.5], "low": -math.inf, "x": math.nan})
    assert text == '{"a":[1,2.5],"low":-Infinity,"x":NaN}'


@pytest.mark.parametrize(
    "payload",
    [
        {
            "s": 'h\u00e9llo "x"\n\u2603',
            "big": 10**30,
            "tiny": 1e-300,
            "flags": [True, False, None],
        },
        {1: "int key", "nested": {"deep": [[{"a": -0.0}]]}},
        [],
        "just text",
        3,
    ],
)
def test_the_reused_c_encoder_writes_what_json_dumps_writes(payload: object) -> None:
    assert p.dumps(payload) == json.dumps(payload, separators=(",", ":"))
    with pytest.raises(TypeError, match="not JSON serializable"):
        p.dumps({"x": {1, 2}})


def test_requests_leave_seq_out_for_servers_that_take_none() -> None:
    step = p.step_request("7", "s-1", "hi", None)
    reset = p.reset_request("8", "s-1", 3, None, None)
    assert "seq" not in step and "seq" not in reset
    assert p.parse_request(step) == p.StepRequest(id="7", op="step", session="s-1", action="hi")
    assert p.Limits(max_message_bytes=4096, session_ttl=1).request_numbers is False  # old servers
