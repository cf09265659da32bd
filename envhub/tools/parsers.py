"""Tool-call parsers: raw model text -> visible content, tool calls, and what was malformed.

Formats, by model family:

- ``hermes`` (Hermes, Qwen2.5/3, SmolLM2):
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one block per call (a JSON list
  inside one block is accepted too).
- ``llama3`` (Llama 3.1+ JSON tool calling): the whole turn is
  ``{"name": ..., "parameters": {...}}``, optionally after ``<|python_tag|>``, several calls
  separated by ``;``.
- ``mistral``: ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}]`` (v3 tokenizers) or
  ``[TOOL_CALLS]name[ARGS]{...}`` (v11+ tokenizers).
- ``openai``: structured ``tool_calls`` from an OpenAI-compatible server (see
  :func:`check_openai_calls`).
- ``auto``: whichever of the text formats the turn uses.

A parser never raises on model output: anything malformed becomes a :class:`ToolCallError`
that the env turns into a tool message telling the model what went wrong.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from envhub.types import ToolCall

PARSE_ERROR = "parse_error"


class JSONLimitError(ValueError):
    """Well-formed JSON that Python will not decode: nested too deeply, or an integer too long."""


def loads_untrusted(text: str) -> Any:
    """``json.loads`` for model-written text: it fails only with ``json.JSONDecodeError`` (bad
    syntax) or :class:`JSONLimitError`.

    Bare ``json.loads`` also raises ``RecursionError`` for brackets nested about a thousand deep
    and ``ValueError`` for an integer past Python's digit limit (``sys.get_int_max_str_digits``);
    both are the model's bad output, not our crash.
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise JSONLimitError("nested too deeply") from None
    except ValueError:  # the only other ValueError json.loads raises on a str: the digit limit
        limit = sys.get_int_max_str_digits()
        raise JSONLimitError(f"an integer has more than {limit} digits") from None


def is_unicode(text: str) -> bool:
    """Whether ``text`` can be encoded as UTF-8: JSON escapes can decode to lone surrogates,
    which a trajectory file (or any JSON writer) refuses."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def writable(text: str) -> str:
    """``text`` with any lone surrogate spelled as its escape (``\\ud800``), so that it can be
    written out; inside a JSON string that escape decodes to the same value."""
    return text if is_unicode(text) else text.encode("utf-8", "backslashreplace").decode("utf-8")


def json_problem(error: ValueError, *, position: bool = False) -> str:
    """What :func:`loads_untrusted` found wrong, for the model; ``position`` adds where."""
    if not isinstance(error, json.JSONDecodeError):
        return str(error)
    return f"{error.msg} at char {error.pos}" if position else error.msg


@dataclass(frozen=True)
class ToolCallError:
    """A tool call the model attempted but wrote wrongly."""

    kind: str
    """``parse_error`` here; the executor adds ``unknown_tool``, ``invalid_arguments``,
    ``tool_error`` and ``timeout``."""
    message: str
    raw: str = ""
    id: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class ParsedTurn:
    """An assistant turn split into what the user would see and what the tools should run."""

    content: str
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[ToolCallError] = field(default_factory=list)

    @property
    def attempted(self) -> int:
        """Tool calls the turn tried to make: the well-formed ones plus the malformed ones."""
        return len(self.calls) + len(self.errors)


class _Ids:
    """Deterministic call ids: ``<prefix><n>``."""

    def __init__(self, prefix: str) -> None:
        self.prefix, self.count = prefix, 0

    def next(self) -> str:
        self.count += 1
        return f"{self.prefix}{self.count}"


def _call_from_object(
    obj: Any, ids: _Ids, raw: str, args_keys: Sequence[str]
) -> ToolCall | ToolCallError:
    """Validate one decoded ``{"name": ..., "arguments": ...}`` object."""
    call_id = ids.next()
    if not isinstance(obj, dict):
        return ToolCallError(
            PARSE_ERROR,
            f"a tool call must be a JSON object, got {type(obj).__name__}",
            raw,
            call_id,
        )
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolCallError(PARSE_ERROR, 'a tool call needs a "name" string', raw, call_id)
    if not is_unicode(name):  # "\ud800" in JSON decodes to a lone surrogate: no file can hold it
        return ToolCallError(PARSE_ERROR, "the tool name is not valid Unicode", raw, call_id)
    key = next((k for k in args_keys if k in obj), None)
    # A string here is double-encoded JSON; it is kept as text and decoded by the executor.
    arguments = obj.get(key, {}) if key else {}
    if isinstance(arguments, str):
        arguments = writable(arguments)
    return ToolCall.make(call_id, name, arguments)


def _decode(text: str, ids: _Ids, what: str) -> Any | ToolCallError:
    try:
        return loads_untrusted(text)
    except ValueError as e:
        return ToolCallError(
            PARSE_ERROR,
            f"{what} is not valid JSON ({json_problem(e, position=True)})",
            text.strip(),
            ids.next(),
        )


def _objects_to_calls(
    decoded: Any, ids: _Ids, raw: str, args_keys: Sequence[str]
) -> list[ToolCall | ToolCallError]:
    items = decoded if isinstance(decoded, list) else [decoded]
    if not items:
        return [ToolCallError(PARSE_ERROR, "empty list of tool calls", raw, ids.next())]
    return [_call_from_object(item, ids, raw, args_keys) for item in items]


def _split(results: list[ToolCall | ToolCallError]) -> tuple[list[ToolCall], list[ToolCallError]]:
    calls = [r for r in results if isinstance(r, ToolCall)]
    errors = [r for r in results if isinstance(r, ToolCallError)]
    return calls, errors


_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)


def parse_hermes(text: str, id_prefix: str = "call_") -> ParsedTurn:
    """Parse ``<tool_call>{json}</tool_call>`` blocks."""
    ids, results, content_parts, last = _Ids(id_prefix), [], [], 0
    for match in _HERMES_BLOCK.finditer(text):
        content_parts.append(text[last : match.start()])
        last = match.end()
        body, closed = match.group(1).strip(), bool(match.group(2))
        if not closed:
            results.append(
                ToolCallError(
                    PARSE_ERROR,
                    "unterminated <tool_call> block (missing </tool_call>)",
                    body,
                    ids.next(),
                )
            )
            continue
        decoded = _decode(body, ids, "the <tool_call> body")
        if isinstance(decoded, ToolCallError):
            results.append(decoded)
        else:
            results.extend(_objects_to_calls(decoded, ids, body, ("arguments", "parameters")))
    content_parts.append(text[last:])
    calls, errors = _split(results)
    return ParsedTurn("".join(content_parts).strip(), calls, errors)


_PYTHON_TAG = "<|python_tag|>"


def _split_top_level(text: str, sep: str = ";") -> list[str]:
    """Split on ``sep`` outside JSON strings and brackets."""
    parts, depth, in_string, escape, start = [], 0, False, False, 0
    for i, ch in enumerate(text):
        if in_string:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == '"':
                in_string = False
            continue
        if ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _looks_like_llama3(text: str) -> bool:
    body = text.strip()
    return body.startswith(_PYTHON_TAG) or bool(re.match(r'^\{\s*"name"\s*:', body))


def parse_llama3(text: str, id_prefix: str = "call_") -> ParsedTurn:
    """Parse Llama-3 JSON tool calls; a turn that is not one is plain content."""
    if not _looks_like_llama3(text):
        return ParsedTurn(text.strip())
    body = text.strip().removeprefix(_PYTHON_TAG)
    ids, results = _Ids(id_prefix), []
    for chunk in _split_top_level(body):
        decoded = _decode(chunk, ids, "the tool call")
        if isinstance(decoded, ToolCallError):
            results.append(decoded)
        else:
            results.extend(_objects_to_calls(decoded, ids, chunk, ("parameters", "arguments")))
    calls, errors = _split(results)
    return ParsedTurn("", calls, errors)


_MISTRAL_MARK = "[TOOL_CALLS]"
_MISTRAL_ARGS = "[ARGS]"


def parse_mistral(text: str, id_prefix: str = "call_") -> ParsedTurn:
    """Parse ``[TOOL_CALLS]`` in the JSON-list (v3) or ``name[ARGS]{...}`` (v11+) form."""
    if _MISTRAL_MARK not in text:
        return ParsedTurn(text.strip())
    content, _, rest = text.partition(_MISTRAL_MARK)
    ids, results = _Ids(id_prefix), []
    for segment in [s for s in rest.split(_MISTRAL_MARK) if s.strip()] or [""]:
        segment = segment.strip()
        if _MISTRAL_ARGS in segment:
            name, _, args_text = segment.partition(_MISTRAL_ARGS)
            decoded = _decode(args_text, ids, f"the arguments of {name.strip()!r}")
            if isinstance(decoded, ToolCallError):
                results.append(decoded)
            else:
                results.append(
                    _call_from_object(
                        {"name": name.strip(), "arguments": decoded}, ids, segment, ("arguments",)
                    )
                )
            continue
        decoded = _decode(segment, ids, "the [TOOL_CALLS] list")
        if isinstance(decoded, ToolCallError):
            results.append(decoded)
        else:
            results.extend(_objects_to_calls(decoded, ids, segment, ("arguments", "parameters")))
    calls, errors = _split(results)
    return ParsedTurn(content.strip(), calls, errors)


def parse_auto(text: str, id_prefix: str = "call_") -> ParsedTurn:
    """Use whichever text format the turn contains (Hermes, Mistral, then Llama-3 JSON)."""
    if "<tool_call>" in text:
        return parse_hermes(text, id_prefix)
    if _MISTRAL_MARK in text:
        return parse_mistral(text, id_prefix)
    return parse_llama3(text, id_prefix)


def check_openai_calls(content: str | None, tool_calls: Sequence[ToolCall]) -> ParsedTurn:
    """Structured calls from an OpenAI-compatible server: check their argument JSON."""
    calls, errors = [], []
    for call in tool_calls:
        try:
            loads_untrusted(call.function.arguments or "{}")
        except ValueError as e:
            errors.append(
                ToolCallError(
                    PARSE_ERROR,
                    f"arguments of {call.name!r} are not valid JSON ({json_problem(e)})",
                    call.function.arguments,
                    call.id,
                    call.name,
                )
            )
            continue
        calls.append(call)
    return ParsedTurn((content or "").strip(), calls, errors)


PARSERS: dict[str, Callable[[str, str], ParsedTurn]] = {
    "auto": parse_auto,
    "hermes": parse_hermes,
    "qwen": parse_hermes,
    "llama3": parse_llama3,
    "mistral": parse_mistral,
}


def get_parser(name: str) -> Callable[[str, str], ParsedTurn]:
    """Look up a text tool-call parser by name."""
    from envhub.errors import ConfigError

    try:
        return PARSERS[name]
    except KeyError:
        raise ConfigError(
            f"unknown tool-call parser {name!r}; choose one of {sorted(PARSERS)}"
        ) from None
