"""The text logic of the terminal tools (:mod:`envhub.tools.terminal`), apart from any sandbox.

Every function here is pure: numbered views with line ranges, an exact-match replace that
refuses an absent or repeated string, output capping that says what it cut, directory listings
and workspace paths. A model's mistake raises :class:`EditError` (a ``ValueError``) whose
message tells the model what to do instead; the tool executor shows it as a tool error.
"""

from __future__ import annotations

import posixpath

from envhub.sandbox.base import WORKDIR

SNIPPET_CONTEXT = 3
"""Lines shown before and after an edit, so the model sees its change in place."""


class EditError(ValueError):
    """A tool call the model got wrong: the message says what to do instead."""


def workspace_path(path: str, *, allow_root: bool = False, workdir: str = WORKDIR) -> str:
    """``path`` relative to the workspace, whose files the session shows at ``/sandbox`` and,
    when ``workdir`` is another path (a task's ``/app``), there too: ``src/a.py`` (relative to
    ``workdir``, the model's current folder), ``/sandbox/src/a.py`` and ``/app/src/a.py`` all
    give ``src/a.py``; the workspace itself is ``.`` when ``allow_root``.

    Raises:
        EditError: The path is empty, leaves the workspace, or names the workspace itself.
    """
    if not path.strip():
        raise EditError("the path is empty; give a file path such as src/main.py")
    absolute = posixpath.normpath(posixpath.join(workdir, path.strip()))
    for root in (workdir, WORKDIR):  # the same files at either path
        if absolute == root:
            if allow_root:
                return "."
            raise EditError(f"{path!r} is the workspace folder itself; give a file inside it")
        if absolute.startswith(root + "/"):
            return absolute[len(root) + 1 :]
    raise EditError(
        f"{path!r} is outside the workspace; files are edited under {workdir} "
        "(use bash to read other files)"
    )


def decode_text(path: str, data: bytes) -> str:
    """The file's text.

    Raises:
        EditError: The file is binary (a NUL byte, or not UTF-8).
    """
    if b"\0" in data[:8192]:
        raise EditError(f"{path} is a binary file ({len(data)} bytes); only text files are shown")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise EditError(
            f"{path} is not UTF-8 text ({len(data)} bytes); only text files are shown"
        ) from None


def number_lines(text: str, start: int = 1) -> str:
    """``text`` with each line prefixed by its number (from ``start``), ``cat -n`` style."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return "\n".join(f"{number:6}\t{line}" for number, line in enumerate(lines, start))


def view_lines(path: str, text: str, view_range: list[int] | None = None) -> str:
    """The file (or lines ``[first, last]`` of it, 1-based and inclusive; ``last = -1`` means
    to the end), numbered.

    Raises:
        EditError: A range that is not two numbers inside the file.
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not view_range:
        return number_lines(text) if lines else f"{path} is empty"
    if len(view_range) != 2:
        raise EditError(f"view_range must be [first, last], got {view_range}")
    first, last = view_range
    total = len(lines)
    if not 1 <= first <= max(total, 1):
        raise EditError(f"view_range starts at line {first}, but {path} has {total} lines")
    if last == -1:
        last = total
    if not first <= last <= total:
        raise EditError(
            f"view_range ends at line {last}: it must be between {first} and {total} "
            f"(the last line of {path}), or -1 for the end"
        )
    return number_lines("\n".join(lines[first - 1 : last]), first)


def replace_once(path: str, text: str, old: str, new: str) -> tuple[str, int]:
    """Replace the one occurrence of ``old`` in ``text`` by ``new``.

    Returns:
        The new text and the line number where the replacement starts.

    Raises:
        EditError: ``old`` is empty, absent (whitespace counts) or occurs more than once (the
            message says how often and on which lines).
    """
    if not old:
        raise EditError("old_str is empty; give the exact text to replace")
    count = text.count(old)
    if count == 0:
        raise EditError(
            f"old_str was not found in {path}; it must match the file exactly, whitespace and "
            "indentation included (view the file to copy it)"
        )
    if count > 1:
        lines = _occurrence_lines(text, old)
        raise EditError(
            f"old_str occurs {count} times in {path} (lines {', '.join(map(str, lines))}); "
            "include more of the surrounding lines to make it unique"
        )
    at = text.index(old)
    return text[:at] + new + text[at + len(old) :], text.count("\n", 0, at) + 1


def snippet(text: str, first_line: int, changed_lines: int) -> str:
    """Numbered lines around an edit: ``changed_lines`` from ``first_line``, plus context."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    start = max(1, first_line - SNIPPET_CONTEXT)
    end = min(len(lines), first_line + max(changed_lines, 1) - 1 + SNIPPET_CONTEXT)
    return number_lines("\n".join(lines[start - 1 : end]), start)


def cap_output(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters, else its head and tail with a note in
    between saying how much was cut (the end of a command's output is often what matters)."""
    if len(text) <= limit:
        return text
    head = text[: limit // 2]
    tail = text[len(text) - (limit - len(head)) :]
    cut = len(text) - len(head) - len(tail)
    return (
        f"{head}\n[... {cut} characters cut here: the output had {len(text)}, "
        f"and {limit} are shown ...]\n{tail}"
    )


def format_listing(path: str, find_output: str, limit: int = 400) -> str:
    """A directory listing from ``find -printf '%y %P\\n'`` lines (``d src``, ``f src/a.py``):
    sorted, folders marked with ``/``, at most ``limit`` entries (the rest counted)."""
    entries = []
    for line in find_output.splitlines():
        kind, _, name = line.partition(" ")
        if name:
            entries.append(name + ("/" if kind == "d" else ""))
    entries.sort()
    shown = entries[:limit]
    head = f"{path} (files and folders up to 2 levels deep, hidden ones left out):"
    body = "\n".join(shown) if shown else "(empty)"
    more = f"\n[... and {len(entries) - limit} more]" if len(entries) > limit else ""
    return f"{head}\n{body}{more}"


def _occurrence_lines(text: str, old: str) -> list[int]:
    lines: list[int] = []
    start = 0
    while (at := text.find(old, start)) != -1:
        line = text.count("\n", 0, at) + 1
        if line not in lines:
            lines.append(line)
        start = at + len(old)
    return lines
