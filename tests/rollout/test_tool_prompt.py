"""Tools reach the model whatever its chat template: probed once, listed in the system prompt
when the template ignores them."""

from __future__ import annotations

import asyncio
from typing import Any

from envhub.rollout.tool_prompt import ToolsInPrompt, describe_tool_prompt, template_renders_tools
from envhub.testing import ByteChatTokenizer
from envhub.tools.prompt import with_tools_in_system
from envhub.types import Message, system, user

TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
MESSAGES = [system("Be careful."), user("1+2?")]


class IgnoresTools(ByteChatTokenizer):
    """A template like SmolLM2's: ``tools`` never reach the prompt. Counts its renders."""

    def __init__(self) -> None:
        super().__init__()
        self.renders = 0

    def render_sync(
        self, messages: Any, tools: list[dict[str, Any]] | None, add_generation_prompt: bool
    ) -> list[int]:
        self.renders += 1
        return super().render_sync(messages, None, add_generation_prompt)


class FailsOnTools(ByteChatTokenizer):
    """A template that raises when given tools (some templates validate the schema)."""

    def render_sync(
        self, messages: list[Message], tools: Any, add_generation_prompt: bool
    ) -> list[int]:
        if tools:
            raise ValueError("this template has no tool support")
        return super().render_sync(messages, tools, add_generation_prompt)


def render(tokenizer: Any, messages: list[Message], tools: Any) -> list[int]:
    return asyncio.run(ToolsInPrompt(tokenizer).render(messages, tools, True))


def test_a_template_that_renders_tools_gets_them_as_they_are() -> None:
    inner = ByteChatTokenizer()
    assert asyncio.run(template_renders_tools(inner)) is True
    assert render(inner, MESSAGES, [TOOL]) == inner.render_sync(MESSAGES, [TOOL], True)


def test_a_template_that_ignores_tools_gets_them_in_the_system_prompt() -> None:
    inner = IgnoresTools()
    assert inner.render_sync(MESSAGES, [TOOL], True) == inner.render_sync(MESSAGES, None, True)
    expected = inner.render_sync(with_tools_in_system(MESSAGES, [TOOL]), None, True)
    assert render(inner, MESSAGES, [TOOL]) == expected
    assert render(inner, MESSAGES, None) == inner.render_sync(MESSAGES, None, True)  # no tools


def test_the_template_is_probed_once_per_tokenizer() -> None:
    inner = IgnoresTools()
    wrapped = ToolsInPrompt(inner)
    for _ in range(3):
        asyncio.run(wrapped.render(MESSAGES, [TOOL], True))
    assert inner.renders == 2 + 3  # the probe's two renders, then one per call


def test_a_template_that_fails_on_tools_counts_as_ignoring_them() -> None:
    inner = FailsOnTools()
    assert asyncio.run(template_renders_tools(inner)) is False
    expected = inner.render_sync(with_tools_in_system(MESSAGES, [TOOL]), None, True)
    assert render(inner, MESSAGES, [TOOL]) == expected


def test_the_header_line_says_where_the_tools_are() -> None:
    assert describe_tool_prompt(True, 2) == "2 tool(s), rendered by the chat template"
    assert describe_tool_prompt(False, 1).startswith("1 tool(s) in the system prompt")


class Slotted:
    """A tokenizer that takes no weak reference (``__slots__``): probed, just not cached."""

    __slots__ = ("inner",)

    def __init__(self) -> None:
        self.inner = IgnoresTools()

    @property
    def max_length(self) -> int | None:
        return None

    async def render(self, messages: Any, tools: Any, add_generation_prompt: bool) -> list[int]:
        return self.inner.render_sync(messages, tools, add_generation_prompt)


def test_a_tokenizer_without_weak_references_is_probed_every_time() -> None:
    tokenizer = Slotted()
    assert asyncio.run(template_renders_tools(tokenizer)) is False
    assert asyncio.run(template_renders_tools(tokenizer)) is False
    assert tokenizer.inner.renders == 4
