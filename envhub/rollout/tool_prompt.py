"""Tools reach the model whatever its chat template does with them.

:func:`template_renders_tools` asks a :class:`ChatTokenizer` once whether its template
renders the ``tools`` argument (a conversation rendered with a probe tool and without one
must differ). :class:`ToolsInPrompt` wraps a tokenizer whose template ignores them and writes
the schemas into the system prompt instead (:mod:`envhub.tools.prompt` documents the format).
The rollout runner renders through it, so every prompt of an episode, and therefore its token
record, carries the same system prompt.
"""

from __future__ import annotations

import weakref
from typing import Any

from envhub.inference.base import ChatTokenizer
from envhub.tools.prompt import with_tools_in_system
from envhub.types import Message, user

_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "envhub_template_probe",
        "description": "Probe whether the chat template renders tools.",
        "parameters": {"type": "object", "properties": {}},
    },
}
_PROBE_MESSAGES = [user("Hello.")]

_ANSWERS: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


async def template_renders_tools(tokenizer: ChatTokenizer) -> bool:
    """Whether ``tokenizer``'s chat template puts ``tools`` into the prompt (asked once per
    tokenizer; a template that fails when given tools counts as not rendering them)."""
    try:
        known = _ANSWERS.get(tokenizer)
    except TypeError:
        known = None
    if known is not None:
        return known
    plain = await tokenizer.render(_PROBE_MESSAGES, None, add_generation_prompt=True)
    try:
        with_tools = await tokenizer.render(
            _PROBE_MESSAGES, [_PROBE_TOOL], add_generation_prompt=True
        )
    except Exception:  # noqa: BLE001 - a template that cannot take tools does not render them
        with_tools = plain
    answer = with_tools != plain
    try:
        _ANSWERS[tokenizer] = answer
    except TypeError:  # a tokenizer that takes no weak reference is probed on every call
        pass
    return answer


def describe_tool_prompt(renders: bool, num_tools: int, from_program: bool = False) -> str:
    """One line for run headers and ``envhub doctor``: where the model finds the tools
    (``from_program``: a harness env's, which its program sends with each call)."""
    tools = "the program's tools (sent with its calls)" if from_program else f"{num_tools} tool(s)"
    if renders:
        return f"{tools}, rendered by the chat template"
    return (
        f"{tools} in the system prompt: the chat template ignores `tools` "
        "(format: envhub.tools.prompt)"
    )


async def where_tools_go(
    tokenizer: ChatTokenizer | None, num_tools: int, from_program: bool = False
) -> str:
    """:func:`describe_tool_prompt` for an engine's tokenizer; without one (chat mode) the
    server's own template decides what the model sees of ``tools``."""
    if tokenizer is None:
        tools = "the program's tools" if from_program else f"{num_tools} tool(s)"
        return f"{tools}, sent to the server as `tools` (chat mode)"
    return describe_tool_prompt(await template_renders_tools(tokenizer), num_tools, from_program)


class ToolsInPrompt:
    """A :class:`ChatTokenizer` that hands ``tools`` to the template when it renders them,
    and otherwise writes them into the system prompt.

    Args:
        inner: The engine's tokenizer.
    """

    def __init__(self, inner: ChatTokenizer) -> None:
        self.inner = inner

    def __repr__(self) -> str:
        return f"ToolsInPrompt({self.inner!r})"

    @property
    def max_length(self) -> int | None:
        """The inner tokenizer's context limit."""
        return self.inner.max_length

    async def render(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
    ) -> list[int]:
        """Token ids of ``messages``, with ``tools`` wherever this template lets the model
        see them."""
        if tools and not await template_renders_tools(self.inner):
            messages, tools = with_tools_in_system(messages, tools), None
        return await self.inner.render(messages, tools, add_generation_prompt)
