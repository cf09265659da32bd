"""Reading an OpenEnv server's ``/schema``: which action mode fits, which fields carry text,
and the JSON schema of the tool a typed action becomes."""

from __future__ import annotations

import json
import re
from typing import Any

from envhub.errors import EnvLoadError

TEXT_FIELDS = ("message", "text", "content", "prompt", "response", "answer", "code", "command")
"""Field names tried, in order, when a schema has several string fields."""
RESERVED = frozenset({"metadata", "reward", "done"})
"""OpenEnv's own fields: never the text (and never sent in an observation's body)."""
MODES = ("auto", "text", "tool", "mcp")
"""``action_mode`` values: the turn's text as one field, a tool whose arguments are the action,
one tool per MCP tool the env lists, or ``auto``: mcp for OpenEnv's ``CallToolAction``, text
when a string field can carry the turn, tool otherwise."""


def fields(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The schema's properties, less OpenEnv's own."""
    return {k: v for k, v in (schema.get("properties") or {}).items() if k not in RESERVED}


def is_text(spec: dict[str, Any]) -> bool:
    """A string field (also ``str | None``, written ``anyOf`` in the JSON schema)."""
    if spec.get("type") == "string":
        return True
    return any(option.get("type") == "string" for option in spec.get("anyOf", ()))


def is_mcp_action(schema: dict[str, Any]) -> bool:
    """Whether the action is OpenEnv's ``CallToolAction`` (MCP tools called through ``step``)."""
    props = schema.get("properties") or {}
    kind = props.get("type") or {}
    return {"tool_name", "arguments"} <= set(props) and "call_tool" in (
        kind.get("const"),
        kind.get("default"),
    )


def text_field(schema: dict[str, Any], chosen: str | None, kind: str) -> str | None:
    """The field of ``schema`` that carries text: ``chosen``, the only string field, or the
    first of :data:`TEXT_FIELDS` among the string fields; ``None`` when none fits.

    Raises:
        EnvLoadError: ``chosen`` is not a field of the schema.
    """
    found = fields(schema)
    if chosen is not None:
        if chosen not in found:
            raise EnvLoadError(f"the OpenEnv {kind} has no field {chosen!r}; it has {list(found)}")
        return chosen
    texts = [name for name, spec in found.items() if is_text(spec)]
    if len(texts) == 1:
        return texts[0]
    return next((name for name in TEXT_FIELDS if name in texts), None)


def unfilled(schema: dict[str, Any], field: str | None, defaults: dict[str, Any]) -> list[str]:
    """Required fields of the action that neither the text nor ``defaults`` fill."""
    return [n for n in schema.get("required", ()) if n != field and n not in defaults]


def choose_mode(
    action: dict[str, Any], mode: str, field: str | None, defaults: dict[str, Any]
) -> str:
    """The action mode for ``mode`` (see :data:`MODES`) and the action's schema.

    Raises:
        EnvLoadError: ``mode`` is unknown, or the action does not fit the mode asked for.
    """
    if mode not in MODES:
        raise EnvLoadError(f"action_mode must be one of {list(MODES)}, not {mode!r}")
    title = action.get("title", "action")
    if mode == "mcp" and not is_mcp_action(action):
        raise EnvLoadError(f"action_mode=mcp: the OpenEnv action {title} is not a CallToolAction")
    if mode == "auto":
        if is_mcp_action(action):
            return "mcp"
        return "text" if field is not None and not unfilled(action, field, defaults) else "tool"
    if mode == "text":
        if field is None:
            raise EnvLoadError(
                f"the OpenEnv action ({title}: {list(fields(action))}) has no string field to "
                "carry the turn's text; name one with action_field=NAME or use action_mode=tool"
            )
        missing = unfilled(action, field, defaults)
        if missing:
            raise EnvLoadError(
                f"the OpenEnv action {title} needs {missing} besides the text field {field!r}; "
                "give them with action_defaults={...}, or drop action_field (the model then "
                "fills every field through a tool)"
            )
    return mode


def tool_name(action: dict[str, Any]) -> str:
    """The tool a typed action becomes: its class name in snake case, less ``Action``
    (``GuessAction`` -> ``guess``); ``act`` when nothing is left."""
    title = re.sub(r"Action$", "", str(action.get("title", "")))
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", title).lower()
    name = re.sub(r"[^a-z0-9_]+", "_", name).strip("_")
    return name[:64] or "act"


def action_parameters(action: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """The JSON schema of a typed action's tool: the action's own, less OpenEnv's fields and
    those ``defaults`` fill (the adapter sends those)."""
    kept = {k: v for k, v in fields(action).items() if k not in defaults}
    parameters: dict[str, Any] = {"type": "object", "properties": kept}
    required = [n for n in action.get("required", ()) if n in kept]
    if required:
        parameters["required"] = required
    if action.get("additionalProperties") is False:
        parameters["additionalProperties"] = False
    if "$defs" in action:
        parameters["$defs"] = action["$defs"]
    return parameters


def observation_text(observation: dict[str, Any], field: str | None) -> str:
    """What the model reads of an observation: the text field; else its one field, if that is
    a string; else its fields as JSON (an empty string when it has none)."""
    if field is not None:
        value = observation.get(field)
        return value if isinstance(value, str) else "" if value is None else str(value)
    shown = {k: v for k, v in observation.items() if k not in RESERVED}
    if len(shown) == 1 and isinstance(next(iter(shown.values())), str):
        return next(iter(shown.values()))
    return json.dumps(shown, default=str) if shown else ""
