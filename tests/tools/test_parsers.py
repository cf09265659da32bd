"""Tool-call parsers: raw model text -> content, calls and errors, exactly.

Call ids are deterministic, so the tests compare them too.
"""

from __future__ import annotations

import json

import pytest

from envhub.errors import ConfigError
from envhub.tools.parsers import (
    PARSE_ERROR,
    ParsedTurn,
    ToolCallError,
    check_openai_calls,
    get_parser,
    parse_auto,
    parse_hermes,
    parse_llama3,
    parse_mistral,
)
from envhub.types import ToolCall


def call(id: str, name: str, arguments: dict | str) -> ToolCall:
    return ToolCall.make(id, name, arguments)


def error(id: str, message: str, raw: str, name: str | None = None) -> ToolCallError:
    return ToolCallError(PARSE_ERROR, message, raw, id, name)


# -- hermes ------------------------------------------------------------------------------------


def test_hermes_several_blocks_keep_the_text_around_them() -> None:
    text = (
        "Let me compute.\n"
        '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
        '<tool_call>{"name": "now", "arguments": {}}</tool_call> done'
    )
    assert parse_hermes(text, "call_3_") == ParsedTurn(
        "Let me compute.\n\n done",
        [call("call_3_1", "add", {"a": 1, "b": 2}), call("call_3_2", "now", {})],
        [],
    )


def test_hermes_list_inside_one_block_and_parameters_key() -> None:
    text = (
        '<tool_call>[{"name": "a", "arguments": {"x": 1}}, '
        '{"name": "b", "parameters": {"y": 2}}, {"name": "c"}]</tool_call>'
    )
    assert parse_hermes(text) == ParsedTurn(
        "",
        [call("call_1", "a", {"x": 1}), call("call_2", "b", {"y": 2}), call("call_3", "c", {})],
        [],
    )


@pytest.mark.parametrize("tail", ["", "\n"])
def test_hermes_unterminated_block(tail: str) -> None:
    text = 'Sure. <tool_call>{"name": "a", "arguments": {"x": 1}}' + tail
    assert parse_hermes(text) == ParsedTurn(
        "Sure.",
        [],
        [
            error(
                "call_1",
                "unterminated <tool_call> block (missing </tool_call>)",
                '{"name": "a", "arguments": {"x": 1}}',
            )
        ],
    )


def test_hermes_bad_json_and_bad_shapes_each_become_an_error_with_its_own_id() -> None:
    text = (
        '<tool_call>{"name": "a", "arguments": {"x": 1}</tool_call>'
        '<tool_call>{"arguments": {"x": 1}}</tool_call>'
        "<tool_call>[]</tool_call>"
        "<tool_call>3</tool_call>"
        '<tool_call>{"name": "ok", "arguments": {}}</tool_call>'
    )
    assert parse_hermes(text) == ParsedTurn(
        "",
        [call("call_5", "ok", {})],
        [
            error(
                "call_1",
                "the <tool_call> body is not valid JSON (Expecting ',' delimiter at char 35)",
                '{"name": "a", "arguments": {"x": 1}',
            ),
            error("call_2", 'a tool call needs a "name" string', '{"arguments": {"x": 1}}'),
            error("call_3", "empty list of tool calls", "[]"),
            error("call_4", "a tool call must be a JSON object, got int", "3"),
        ],
    )


def test_hermes_double_encoded_arguments_are_kept_as_text_for_the_executor() -> None:
    text = '<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call>'
    assert parse_hermes(text) == ParsedTurn("", [call("call_1", "a", '{"x": 1}')], [])


def test_hermes_without_blocks_is_plain_content() -> None:
    assert parse_hermes("  The answer is 4.  ") == ParsedTurn("The answer is 4.")


# -- llama3 ------------------------------------------------------------------------------------


def test_llama3_python_tag_and_calls_split_on_semicolons() -> None:
    text = (
        '<|python_tag|>{"name": "a", "parameters": {"x": 1}}; '
        '{"name": "b", "parameters": {"s": "p;q"}}'
    )
    assert parse_llama3(text) == ParsedTurn(
        "", [call("call_1", "a", {"x": 1}), call("call_2", "b", {"s": "p;q"})], []
    )


def test_llama3_semicolons_and_brackets_inside_strings_with_escaped_quotes() -> None:
    first = json.dumps({"name": "a", "parameters": {"s": 'a " then }; {'}})
    second = json.dumps({"name": "b", "parameters": {"path": "C:\\dir\\"}})
    assert parse_llama3(f"{first}; {second}") == ParsedTurn(
        "",
        [call("call_1", "a", {"s": 'a " then }; {'}), call("call_2", "b", {"path": "C:\\dir\\"})],
        [],
    )


def test_llama3_plain_text_is_not_a_call() -> None:
    assert parse_llama3("The answer is 4; I checked.\n") == ParsedTurn(
        "The answer is 4; I checked."
    )


def test_llama3_bad_json_is_an_error() -> None:
    text = '{"name": "a", "parameters": {"x": 1}'
    assert parse_llama3(text) == ParsedTurn(
        "",
        [],
        [
            error(
                "call_1",
                "the tool call is not valid JSON (Expecting ',' delimiter at char 36)",
                text,
            )
        ],
    )


def test_llama3_one_good_call_and_one_bad_call() -> None:
    text = '{"name": "a", "parameters": {}}; {"name": 7}'
    assert parse_llama3(text, "c") == ParsedTurn(
        "", [call("c1", "a", {})], [error("c2", 'a tool call needs a "name" string', '{"name": 7}')]
    )


# -- mistral -----------------------------------------------------------------------------------


def test_mistral_v3_json_list() -> None:
    text = (
        'Checking. [TOOL_CALLS] [{"name": "a", "arguments": {"x": 1}}, '
        '{"name": "b", "arguments": {}}]'
    )
    assert parse_mistral(text) == ParsedTurn(
        "Checking.", [call("call_1", "a", {"x": 1}), call("call_2", "b", {})], []
    )


def test_mistral_v11_name_args_form_with_one_bad_call() -> None:
    text = '[TOOL_CALLS]a[ARGS]{"x": 1}[TOOL_CALLS]b[ARGS]{bad}'
    assert parse_mistral(text) == ParsedTurn(
        "",
        [call("call_1", "a", {"x": 1})],
        [
            error(
                "call_2",
                "the arguments of 'b' is not valid JSON "
                "(Expecting property name enclosed in double quotes at char 1)",
                "{bad}",
            )
        ],
    )


def test_mistral_marker_with_nothing_after_it() -> None:
    assert parse_mistral("[TOOL_CALLS]") == ParsedTurn(
        "",
        [],
        [
            error(
                "call_1", "the [TOOL_CALLS] list is not valid JSON (Expecting value at char 0)", ""
            )
        ],
    )


def test_mistral_without_marker_is_plain_content() -> None:
    assert parse_mistral(" no calls ") == ParsedTurn("no calls")


# -- openai structured calls -------------------------------------------------------------------


def test_openai_calls_with_malformed_argument_json() -> None:
    calls = [call("c1", "a", '{"x": 1}'), call("c2", "b", '{"x": '), call("c3", "c", "")]
    assert check_openai_calls(" thinking ", calls) == ParsedTurn(
        "thinking",
        [calls[0], calls[2]],
        [
            ToolCallError(
                PARSE_ERROR,
                "arguments of 'b' are not valid JSON (Expecting value)",
                '{"x": ',
                "c2",
                "b",
            )
        ],
    )
    assert check_openai_calls(None, []) == ParsedTurn("")


# -- auto detection, registry, determinism -----------------------------------------------------

_SAMPLES = {
    "hermes": 'x <tool_call>{"name": "a", "arguments": {"k": 1}}</tool_call>',
    "mistral": '[TOOL_CALLS] [{"name": "a", "arguments": {"k": 1}}]',
    "llama3": '<|python_tag|>{"name": "a", "parameters": {"k": 1}}',
}


@pytest.mark.parametrize("family", sorted(_SAMPLES))
def test_auto_detects_each_format(family: str) -> None:
    parsed = parse_auto(_SAMPLES[family], "call_2_")
    assert parsed == get_parser(family)(_SAMPLES[family], "call_2_")
    assert parsed.calls == [call("call_2_1", "a", {"k": 1})]


def test_auto_on_plain_text() -> None:
    assert parse_auto("Just text.") == ParsedTurn("Just text.")
    assert parse_auto("Just text.").attempted == 0


def test_qwen_is_hermes_and_unknown_parser_names_the_choices() -> None:
    assert get_parser("qwen") is parse_hermes
    with pytest.raises(ConfigError) as info:
        get_parser("gemma")
    assert str(info.value) == (
        "unknown tool-call parser 'gemma'; "
        "choose one of ['auto', 'hermes', 'llama3', 'mistral', 'qwen']"
    )


def test_parsing_is_deterministic() -> None:
    text = _SAMPLES["hermes"] + '<tool_call>{"name": "b"}</tool_call><tool_call>oops</tool_call>'
    first, second = parse_auto(text, "call_1_"), parse_auto(text, "call_1_")
    assert first == second
    assert [c.id for c in first.calls] + [e.id for e in first.errors] == [
        "call_1_1",
        "call_1_2",
        "call_1_3",
    ]
    assert first.attempted == 3
