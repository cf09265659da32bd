"""Whether ``rollout.max_tokens`` can hold one tool call of each env trained on.

A turn cut off inside ``<tool_call>`` is a malformed call, so an env whose tools the model can
never finish calling trains on nothing and says little about why. The shortest call an env
allows is written in the format the ``hermes``/``auto`` parsers read (the format envhub puts
in the system prompt, and the one Qwen-style templates use) with placeholder arguments for the
required parameters only, and counted with the model's tokenizer. A harness env's tools come
with its program's calls, so its call is one to a tool named ``tool`` with one short argument.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from envhub.tools.prompt import tool_call_block

_PLACEHOLDERS: dict[str, Any] = {
    "string": "example",
    "integer": 42,
    "number": 1.5,
    "boolean": True,
    "array": [],
    "object": {},
    "null": None,
}
HARNESS_TOOL = {
    "type": "function",
    "function": {
        "name": "tool",
        "parameters": {
            "type": "object",
            "properties": {"input": {"type": "string"}},
            "required": ["input"],
        },
    },
}
"""What a harness env's call is measured with: its program's tools are unknown before it runs."""
SLACK = 2
"""A turn's budget should hold twice the shortest call: real arguments are longer."""


def call_text(schema: dict[str, Any]) -> str:
    """The shortest call to the tool of OpenAI ``schema``, as the model writes it."""
    function = schema.get("function", schema)
    parameters = function.get("parameters") or {}
    properties = parameters.get("properties") or {}
    arguments = {
        name: _placeholder(properties.get(name) or {}) for name in parameters.get("required") or []
    }
    return tool_call_block(function["name"], arguments)


def _placeholder(prop: dict[str, Any]) -> Any:
    if "enum" in prop and prop["enum"]:
        return prop["enum"][0]
    kind = prop.get("type", "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    return _PLACEHOLDERS.get(kind, "example")


def shortest_call_tokens(schemas: Sequence[dict[str, Any]], count: Any) -> int:
    """Tokens of the shortest call among ``schemas`` (``count``: text -> number of tokens)."""
    return min(count(call_text(schema)) for schema in schemas)


def call_budget_warning(
    env_name: str, schemas: Sequence[dict[str, Any]], max_tokens: int, count: Any, *,
    from_program: bool = False,
) -> str | None:  # fmt: skip
    """A warning when ``max_tokens`` cannot hold the shortest call to one of ``schemas`` (every
    call would be cut off), or not twice it (a call with real arguments, or a word before it,
    would be); with ``from_program``, :data:`HARNESS_TOOL` stands for a harness env's tools."""
    tools = [HARNESS_TOOL] if from_program else list(schemas)
    if not tools:
        return None
    needed = shortest_call_tokens(tools, count)
    if max_tokens >= SLACK * needed:
        return None
    what = (
        "a tool call with one short argument (its program's tools are only known when it runs)"
        if from_program
        else "its shortest tool call, with placeholder arguments,"
    )
    outcome = (
        "every call would be cut off"
        if max_tokens < needed
        else "a call with real arguments, or any text before it, would be cut off"
    )
    return (
        f"rollout.max_tokens is {max_tokens}, but {what} in {env_name} takes {needed} tokens: "
        f"{outcome}; set rollout.max_tokens={_round_up(needed * 4)} or more"
    )


def _round_up(tokens: int) -> int:
    """A generous budget: a call with real arguments plus a little text, to 64 tokens."""
    return max(64, -(-tokens // 64) * 64)


def tool_call_warnings(config: Any) -> list[str]:
    """:func:`call_budget_warning` for each env of a training config (each env made once, the
    model's tokenizer loaded only when some env has tools)."""
    import envhub

    found = []
    for spec in config.envs:
        env = envhub.make(spec.name, **spec.args)
        try:
            from_program = bool(getattr(env, "tools_come_from_program", False))
            found.append((spec.name, list(env.tool_schemas or ()), from_program))
        finally:
            env.close()
    if not any(schemas or from_program for _, schemas, from_program in found):
        return []
    count = _token_counter(config.model.name)
    warnings = [
        call_budget_warning(name, schemas, config.rollout.max_tokens, count, from_program=program)
        for name, schemas, program in found
    ]
    return [w for w in warnings if w]


def _token_counter(model: str) -> Any:
    from transformers import AutoTokenizer

    from envhub.trainer.models import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(model))
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])
