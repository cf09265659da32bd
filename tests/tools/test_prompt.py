"""The documented format that lists tools in the system prompt."""

from __future__ import annotations

import json
import re
from pathlib import Path

import envhub
from envhub.tools.parsers import parse_auto
from envhub.tools.prompt import (
    TOOL_FORMAT_HINT,
    tool_call_block,
    tools_prompt,
    with_tools_in_system,
)
from envhub.types import system, user

TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
    },
}


def test_tools_prompt_lists_each_schema_on_one_line_then_the_call_format() -> None:
    assert tools_prompt([TOOL, TOOL]) == (
        "# Tools\n\nYou can call these tools; each line is one tool's JSON schema:\n<tools>\n"
        f"{json.dumps(TOOL)}\n{json.dumps(TOOL)}\n</tools>\n\n{TOOL_FORMAT_HINT}"
    )


def test_the_format_hint_is_not_repeated_when_the_system_prompt_has_it() -> None:
    text = tools_prompt([TOOL], f"Be careful.\n\n{TOOL_FORMAT_HINT}")
    assert TOOL_FORMAT_HINT not in text and text.endswith("</tools>")


def test_the_system_message_gets_the_tools_after_its_own_text() -> None:
    messages = [system("Be careful."), user("1+2?")]
    out = with_tools_in_system(messages, [TOOL])
    assert out[0].content == f"Be careful.\n\n{tools_prompt([TOOL])}"
    assert out[1] == messages[1] and messages[0].content == "Be careful."  # input untouched


def test_a_conversation_without_system_message_gets_one_that_holds_only_the_tools() -> None:
    out = with_tools_in_system([user("1+2?")], [TOOL])
    assert [m.role for m in out] == ["system", "user"]
    assert out[0].content == tools_prompt([TOOL])


def test_a_call_written_as_the_hint_says_is_read_by_the_default_parser() -> None:
    written = TOOL_FORMAT_HINT.split("\n", 1)[1].replace(
        '"<tool name>", "arguments": {<arguments as JSON>}', '"add", "arguments": {"a": 1, "b": 2}'
    )
    parsed = parse_auto(written)
    assert [(c.function.name, json.loads(c.function.arguments)) for c in parsed.calls] == [
        ("add", {"a": 1, "b": 2})
    ]


def test_the_tool_call_block_is_written_only_by_tool_call_block() -> None:
    """The envs' reference policies, the audit, the doctor and the transcript writer all call
    :func:`tool_call_block`; no other module writes the block out itself."""
    package = Path(envhub.__file__).parent
    writers = [
        str(path.relative_to(package))
        for path in sorted(package.rglob("*.py"))
        if re.search(r"<tool_call>\\n", path.read_text())
    ]
    assert writers == ["tools/prompt.py"]
    # Non-ASCII arguments as written (the older copies escaped them: ``\u00e9``).
    assert tool_call_block("f", {"x": "é"}) == (
        '<tool_call>\n{"name": "f", "arguments": {"x": "é"}}\n</tool_call>'
    )
