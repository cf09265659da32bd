"""Tool schemas written into the system prompt, for chat templates that ignore ``tools``.

Chat templates of tool-calling models render the ``tools`` argument; many small models'
templates do not (SmolLM2's drops it without a word), and the model then never sees what it
could call. For those templates envhub puts the schemas into the system prompt itself, in
this documented format (the one the ``hermes`` and ``auto`` parsers read)::

    <the env's system prompt>

    # Tools

    You can call these tools; each line is one tool's JSON schema:
    <tools>
    {"type": "function", "function": {"name": ..., "description": ..., "parameters": ...}}
    </tools>

    To call a tool, write one block per call:
    <tool_call>
    {"name": "<tool name>", "arguments": {<arguments as JSON>}}
    </tool_call>

The last paragraph (:data:`TOOL_FORMAT_HINT`) is left out when the system prompt already
contains it. A conversation without a system message gets one that holds only the tools.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from envhub.types import Message, system

TOOL_FORMAT_HINT = (
    "To call a tool, write one block per call:\n"
    '<tool_call>\n{"name": "<tool name>", "arguments": {<arguments as JSON>}}\n</tool_call>'
)

TOOLS_HEADING = "# Tools"


def tool_call_block(name: str, arguments: Any) -> str:
    """One call written in the format above: ``<tool_call>``, the call's JSON, ``</tool_call>``
    (``arguments`` as they go in the JSON: a dict, or a string kept as written)."""
    call = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{call}\n</tool_call>"


def tools_prompt(tools: Sequence[dict[str, Any]], system_prompt: str = "") -> str:
    """The text that lists ``tools`` (OpenAI schemas) and how to call them, to follow
    ``system_prompt`` (whose own format hint, if it has one, is not repeated)."""
    schemas = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    parts = [
        TOOLS_HEADING,
        f"You can call these tools; each line is one tool's JSON schema:\n<tools>\n{schemas}\n"
        "</tools>",
    ]
    if TOOL_FORMAT_HINT not in system_prompt:
        parts.append(TOOL_FORMAT_HINT)
    return "\n\n".join(parts)


def with_tools_in_system(
    messages: Sequence[Message], tools: Sequence[dict[str, Any]]
) -> list[Message]:
    """``messages`` with :func:`tools_prompt` appended to the system message (or, when the
    conversation has none, in a new system message before the first message)."""
    out = list(messages)
    if out and out[0].role == "system":
        content = out[0].content or ""
        listed = tools_prompt(tools, content)
        out[0] = out[0].model_copy(
            update={"content": f"{content}\n\n{listed}" if content.strip() else listed}
        )
    else:
        out.insert(0, system(tools_prompt(tools)))
    return out
