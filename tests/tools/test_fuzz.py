"""Fuzzing the tool-call path with adversarial model output (hypothesis).

Model text is data, never trusted: brackets nested 100,000 deep, MB payloads, lone surrogates,
RTL marks, zero-width and combining characters, NUL bytes, numbers Python's ``json`` balks at
(``1e400``, ``NaN``, integers of 10,000 digits), unbalanced or doubled ``<tool_call>`` tags,
unknown tools, arguments of the wrong type, thousands of calls in one turn. The properties:
nothing raises, no answer takes pathologically long, and what comes back is well-formed.

The profile is deterministic and small enough for CI; ``bench/fuzz.py`` runs the same
properties with fresh random examples for as long as it is asked to (``ENVHUB_FUZZ_PROFILE``).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from envhub.envs.calculator import CalculatorEnv, calculate
from envhub.rewards.match import _boxed, extract_answer, final_number
from envhub.tools.executor import ERROR_KINDS, UNKNOWN_TOOL, ToolExecutor
from envhub.tools.parsers import PARSE_ERROR, PARSERS, ParsedTurn, ToolCallError, check_openai_calls
from envhub.tools.tool import tool
from envhub.types import Message, ToolCall

TIME_LIMIT_S = 10.0
"""A bound that catches a pathological case, not slowness: the slowest answer of the profile
takes ~0.06 s on an idle 2-core machine (1.05 s was seen on a loaded one), while a backtracking
regex or a quadratic pass over the megabyte inputs takes minutes."""

settings.register_profile(
    "fuzz",
    max_examples=int(os.environ.get("ENVHUB_FUZZ_EXAMPLES", "250")),
    derandomize=True,
    database=None,
    deadline=None,  # each test asserts its own bound on the call under test
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# The soak (bench/fuzz.py): fresh random examples on every run, and a blob to replay a failure.
settings.register_profile("soak", settings.get_profile("fuzz"), derandomize=False, print_blob=True)
FUZZ = settings.get_profile(os.environ.get("ENVHUB_FUZZ_PROFILE", "fuzz"))

# -- strategies ----------------------------------------------------------------------------------

ODD_CHARACTERS = (
    "\x00",  # NUL
    "\ud800",  # lone high surrogate
    "\udfff",  # lone low surrogate
    "\u202e",  # right-to-left override
    "\u200f",  # right-to-left mark
    "\u200b",  # zero-width space
    "\u200d",  # zero-width joiner
    "\ufeff",  # byte-order mark
    "e\u0301\u0308\u0323",  # a letter under three combining marks
    "\uffff",
    "\U0010ffff",
    "\r",
    "\x1b[2J",
)
JSON_NUMBER_LITERALS = (
    "1e400",
    "-1e400",
    "1e-400",
    "-0",
    "-0.0",
    "NaN",
    "Infinity",
    "-Infinity",
    "1" + "0" * 5000,  # 10**5000: past Python's 4300-digit limit
    "-" + "9" * 20_000,
    "0.1e99999999999",
    "00",
    "1.",
    ".5",
    "0x10",
    "+1",
)
MARKUP = (
    "<tool_call>",
    "</tool_call>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "<|python_tag|>",
    '{"name": "calculate", "arguments": ',
    '{"name": ',
    '"arguments": ',
    "\\boxed{",
    "<answer>",
    "</answer>",
    "Answer: ",
    "{",
    "}",
    "[",
    "]",
    '"',
    "\\",
    "\\u",
    "\\ud800",
    ",",
    ":",
    ";",
    "\n",
    " ",
    "1,000",
)
TOOL_NAMES = (
    "calculate",
    "add",
    "echo",
    "scale",
    "nonexistent",
    "",
    " calculate",
    "CALCULATE",
    "calculate\x00",
    "calc\u200bulate",
    "\u202ecalculate",
    "x" * 10_000,
)

odd_text = st.lists(
    st.one_of(st.characters(exclude_categories=()), st.sampled_from(ODD_CHARACTERS)), max_size=30
).map("".join)
json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), odd_text, st.just(10**4000)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(odd_text, inner, max_size=4),
    max_leaves=12,
)
nested = st.builds(
    lambda pair, depth, closed: pair[0] * depth + "1" + (pair[1] * depth if closed else ""),
    st.sampled_from([("[", "]"), ('{"a": ', "}"), ('{"arguments": ', "}"), ('"\\', "\\")]),
    st.one_of(st.integers(1, 50), st.integers(900, 1100), st.integers(1, 100_000)),
    st.booleans(),
)
# Up to a few MB built from one fragment: cheap for hypothesis to draw, costly to parse.
huge = st.builds(
    lambda fragment, times: fragment * times,
    st.sampled_from(MARKUP + ODD_CHARACTERS + JSON_NUMBER_LITERALS[:8]),
    st.integers(1, 100_000),
)
binary_junk = st.binary(max_size=64).map(lambda data: data.decode("latin-1"))
json_texts = st.one_of(
    json_values.map(json.dumps),
    json_values.map(lambda value: json.dumps(value, ensure_ascii=False)),
    st.sampled_from(JSON_NUMBER_LITERALS),
    nested,
    huge,
    binary_junk,
    odd_text,
)
expressions = st.one_of(
    st.text(alphabet="0123456789+-*/(). e", max_size=60),
    st.sampled_from(["1/0", "1e308*1e308", "*".join(["1e308"] * 33), "(" * 99 + "1" + ")" * 99]),
    odd_text,
)
arguments = st.one_of(
    st.builds(lambda e: json.dumps({"expression": e}), expressions),
    st.builds(lambda v: json.dumps({"expression": v}), json_values),  # wrong types
    st.builds(lambda a, b: json.dumps({"a": a, "b": b}), json_values, json_values),
    st.builds(lambda e: json.dumps(json.dumps({"expression": e})), expressions),  # double-encoded
    json_texts,
)


@st.composite
def call_objects(draw: st.DrawFn) -> str:
    """One call's JSON text: a name (real, unknown or odd) and arguments under some key."""
    name = draw(st.one_of(st.sampled_from(TOOL_NAMES), odd_text, json_values))
    key = draw(st.sampled_from(["arguments", "parameters", "args"]))
    return f'{{"name": {json.dumps(name, ensure_ascii=False)}, "{key}": {draw(arguments)}}}'


@st.composite
def framed_calls(draw: st.DrawFn) -> str:
    """Calls in each text format, correctly or wrongly framed."""
    calls = draw(st.lists(st.one_of(call_objects(), json_texts), min_size=1, max_size=4))
    frame = draw(st.sampled_from(["hermes", "unclosed", "doubled", "llama3", "mistral", "v11"]))
    if frame == "hermes":
        return "".join(f"<tool_call>{c}</tool_call>" for c in calls)
    if frame == "unclosed":
        return "".join(f"<tool_call>{c}" for c in calls)
    if frame == "doubled":
        return "".join(f"<tool_call><tool_call>{c}</tool_call></tool_call>" for c in calls)
    if frame == "llama3":
        return "<|python_tag|>" + ";".join(calls)
    if frame == "mistral":
        return f"[TOOL_CALLS] [{', '.join(calls)}]"
    return "".join(f"[TOOL_CALLS]{draw(odd_text)}[ARGS]{c}" for c in calls)


many_calls = st.builds(
    lambda call, times: f"<tool_call>{call}</tool_call>" * times,
    call_objects().filter(lambda call: len(call) < 10_000),  # a few MB in all, not a GB
    st.integers(1, 300),
)
model_outputs = st.one_of(
    st.lists(
        st.one_of(framed_calls(), json_texts, odd_text, st.sampled_from(MARKUP)), max_size=6
    ).map("".join),
    many_calls,
    huge,
    binary_junk,
)


def timed(fn: Any, *args: Any) -> Any:
    """Run ``fn(*args)`` and assert that it took less than :data:`TIME_LIMIT_S`."""
    start = time.perf_counter()
    result = fn(*args)
    elapsed = time.perf_counter() - start
    assert elapsed < TIME_LIMIT_S, f"took {elapsed:.2f} s"
    return result


def is_text(value: str) -> bool:
    """Whether ``value`` can be written out as UTF-8 (no lone surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# -- parsers ----------------------------------------------------------------------------------


def assert_well_formed(parsed: ParsedTurn, prefix: str) -> None:
    assert isinstance(parsed, ParsedTurn) and isinstance(parsed.content, str)
    for call in parsed.calls:
        assert isinstance(call, ToolCall) and call.id.startswith(prefix)
        assert isinstance(call.name, str) and call.name and is_text(call.name)
        assert isinstance(call.function.arguments, str)
        ToolCall.model_validate_json(call.model_dump_json())  # survives a trajectory file
    for error in parsed.errors:
        assert isinstance(error, ToolCallError) and error.kind == PARSE_ERROR
        assert isinstance(error.message, str) and error.message
        assert isinstance(error.raw, str) and error.id.startswith(prefix)
    ids = [c.id for c in parsed.calls] + [e.id for e in parsed.errors]
    assert len(set(ids)) == len(ids)


@FUZZ
@given(text=model_outputs, parser=st.sampled_from(sorted(PARSERS)))
@example(
    text='<tool_call>{"name": "f", "arguments": {"x": ' + "1" * 5000 + "}}</tool_call>",
    parser="hermes",
)
@example(text="<tool_call>" + "[" * 100_000 + "</tool_call>", parser="hermes")
@example(text='{"name": "f", "parameters": ' + '{"a": ' * 5000 + "1" + "}" * 5001, parser="llama3")
@example(text='<tool_call>{"name": "\\ud800", "arguments": {}}</tool_call>', parser="auto")
@example(text='[TOOL_CALLS]f[ARGS]"\\ud800"', parser="mistral")
@example(
    text='<tool_call>{"name": "f", "arguments": "{\\"x\\": \\"\\ud800\\"}"}</tool_call>',
    parser="hermes",
)
def test_parsers_never_raise_and_return_well_formed_turns(text: str, parser: str) -> None:
    parsed = timed(PARSERS[parser], text, "call_7_")
    assert_well_formed(parsed, "call_7_")


@FUZZ
@given(
    pairs=st.lists(
        st.tuples(st.one_of(st.sampled_from(TOOL_NAMES), odd_text), arguments), max_size=4
    )
)
def test_openai_calls_are_each_kept_or_reported_once(pairs: list[tuple[str, str]]) -> None:
    calls = [ToolCall.make(f"srv-{i}", name, text) for i, (name, text) in enumerate(pairs)]
    parsed = timed(check_openai_calls, "", calls)
    reported = {e.id for e in parsed.errors}
    assert parsed.calls == [c for c in calls if c.id not in reported]
    assert [e.id for e in parsed.errors] == [c.id for c in calls if c.id in reported]
    for error in parsed.errors:
        assert (
            error.kind == PARSE_ERROR and error.raw == calls[int(error.id[4:])].function.arguments
        )


@FUZZ
@given(
    name=st.sampled_from(["calculate", "add", "f-1", "x_y"]),
    args=st.dictionaries(st.text(max_size=10), json_values, max_size=4),
)
def test_a_well_formed_hermes_call_is_parsed_exactly(name: str, args: dict[str, Any]) -> None:
    text = (
        f"Let me call it.\n<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"
    )
    assert PARSERS["hermes"](text, "c") == ParsedTurn(
        "Let me call it.", [ToolCall.make("c1", name, args)]
    )


# -- executor ------------------------------------------------------------------------------------


@tool(inline=True)
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool(inline=True)
def echo(text: str) -> str:
    """Return the text as given."""
    return text


@tool(inline=True)
def scale(x: float, factor: float = 1.0) -> float:
    """Multiply a number."""
    return x * factor


EXECUTOR = ToolExecutor({t.name: t for t in (calculate, add, echo, scale)}, default_timeout=5.0)


def run_executor(parsed: ParsedTurn) -> list[Any]:
    return asyncio.run(EXECUTOR.run(parsed))


@FUZZ
@given(text=model_outputs)
@example(text='<tool_call>{"name": "echo", "arguments": {"text": "\\ud800"}}</tool_call>')
@example(
    text='<tool_call>{"name": "add", "arguments": "{\\"a\\": ' + "9" * 5000 + '}"}</tool_call>'
)
def test_executor_answers_every_call_with_one_tool_message(text: str) -> None:
    parsed = PARSERS["auto"](text, "call_")
    outcomes = timed(run_executor, parsed)
    expected_ids = [e.id for e in parsed.errors] + [c.id for c in parsed.calls]
    assert [o.message.tool_call_id for o in outcomes] == expected_ids
    unknown = {c.id for c in parsed.calls if c.name not in EXECUTOR.tools}
    for outcome in outcomes:
        assert outcome.message.role == "tool" and outcome.error in (*ERROR_KINDS, None)
        assert outcome.message.content.startswith("Error: ") == (outcome.error is not None)
        assert (outcome.error == UNKNOWN_TOOL) == (outcome.message.tool_call_id in unknown)
        Message.model_validate_json(outcome.message.model_dump_json())


@FUZZ
@given(name=st.sampled_from(["calculate", "add", "echo", "scale"]), text=arguments)
@example(name="add", text="[" * 50_000)
@example(name="add", text='"' + "[" * 50_000 + '"')
def test_executor_reports_any_argument_text_as_an_outcome(name: str, text: str) -> None:
    parsed = ParsedTurn("", [ToolCall.make("c1", name, text)])
    (outcome,) = timed(run_executor, parsed)
    assert outcome.error in ("invalid_arguments", "tool_error", None)
    assert outcome.message.tool_call_id == "c1" and outcome.message.name == name


# -- ToolEnv.step (the calculator env) -----------------------------------------------------------

ENV = CalculatorEnv(num_tasks=4, max_turns=2)


def step_once(action: str | Message) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
    ENV.reset(seed=0)
    return ENV.step(action)


def assert_step_is_data(result: tuple[Any, ...], action_text: str) -> None:
    observation, reward, terminated, truncated, info = result
    assert all(m.role == "tool" for m in observation)
    assert terminated == (not observation) and not truncated
    assert reward in (0.0, 1.0) and info["turn"] == 1
    if terminated:
        assert info["errors"] == []  # no reward function failed on the text
    if is_text(action_text):  # the trajectory can be written (a sampled turn is valid UTF-8)
        for message in ENV.state.messages:
            Message.model_validate_json(message.model_dump_json())


@FUZZ
@given(text=model_outputs)
@example(text="\\boxed{" * 10_000)
@example(text="\n" * 100_000 + "1")
@example(text="</answer>" + "<answer>" * 100_000)
@example(text='<tool_call>{"name": "\\ud800", "arguments": {}}</tool_call>')
@example(text='<tool_call>{"name": "calculate", "arguments": {"expression": ' + "[" * 2000)
def test_tool_env_step_turns_any_text_into_data(text: str) -> None:
    assert_step_is_data(timed(step_once, text), text)


@FUZZ
@given(
    calls=st.lists(
        st.tuples(st.one_of(st.sampled_from(TOOL_NAMES), odd_text), arguments), max_size=5
    )
)
def test_tool_env_step_takes_any_structured_calls(calls: list[tuple[str, str]]) -> None:
    tool_calls = tuple(ToolCall.make(f"srv-{i}", n, a) for i, (n, a) in enumerate(calls))
    action = Message(role="assistant", content="", tool_calls=tool_calls or None)
    result = timed(step_once, action)
    checked = check_openai_calls("", tool_calls)  # answered malformed first, then the rest
    expected_ids = [e.id for e in checked.errors] + [c.id for c in checked.calls]
    assert [m.tool_call_id for m in result[0]] == expected_ids


# -- reward helpers the final step runs ----------------------------------------------------------


def naive_boxed(text: str) -> list[str]:
    """The obvious quadratic definition: from each ``\\boxed{``, scan to its matching brace."""
    found, opener = [], "\\boxed{"
    start = text.find(opener)
    while start >= 0:
        depth = 0
        for i in range(start + len(opener) - 1, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                found.append(text[start + len(opener) : i])
                break
        start = text.find(opener, start + 1)
    return found


@FUZZ
@given(
    st.lists(st.sampled_from(["\\boxed{", "{", "}", "x", "\\frac{1}{2}"]), max_size=20).map("".join)
)
@example("}} \\boxed{\\boxed{1}} {\\boxed{2")
def test_boxed_matches_its_quadratic_definition(text: str) -> None:
    assert _boxed(text) == naive_boxed(text)


def test_answer_extraction_keeps_its_results() -> None:
    assert extract_answer("Answer:  42  \n\nmore") == "42"
    assert extract_answer("  final answer\n:\n 7 \nAnswer: 8") == "8"
    assert extract_answer("<answer> 7 </answer><answer> 8") == "7"
    assert final_number("\\boxed{\\boxed{3}} then \\boxed{4") == 3.0
