"""Tools for terminal agents, bound to the episode's sandbox session: ``bash``, ``view``,
``create`` and ``str_replace``.

Each is a normal :class:`~envhub.tools.tool.Tool` with an OpenAI schema. The session is an
injected argument (``session`` in the tool context), and so are the variables commands run
with (``command_env``) and the model's current folder (``workdir``):
:class:`~envhub.workspace_env.WorkspaceEnv` supplies them, and a harness program or your own
env passes :func:`terminal_context` as the context.

The current folder is ``/sandbox``, or a path where the session shows the same folder again
(:class:`~envhub.sandbox.session.SessionPaths`: a Harbor task's ``/app``). Commands start there,
and the file tools take paths relative to it or absolute under it or ``/sandbox``: ``/app/x``
and ``/sandbox/x`` are one file.

- ``bash``: runs a command in the current folder; files and background processes persist
  until the episode ends. ``timeout`` is capped by the session's ``wall_time``. The reply
  starts with ``[exit N]`` (or why the command was stopped), then stdout and stderr, cut to
  :data:`MAX_OUTPUT_CHARS` with the cut said where it happened.
- ``view``: a text file with line numbers, or lines ``[first, last]`` of it; a folder's files
  two levels deep.
- ``create``: creates or overwrites a file (parent folders too).
- ``str_replace``: replaces one exact occurrence of ``old_str``; refuses (saying how often it
  occurs, and on which lines) when it is absent or repeated.

A model's mistake (a bad path, a binary file, a missing string) is a tool error the model
reads; it never ends the episode. The text logic lives in :mod:`envhub.tools.text_edits`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from envhub.sandbox.base import WORKDIR, ExecResult, as_argv
from envhub.sandbox.session import Session
from envhub.tools.text_edits import (
    EditError,
    cap_output,
    decode_text,
    format_listing,
    replace_once,
    snippet,
    view_lines,
    workspace_path,
)
from envhub.tools.tool import Injected, Tool, tool

MAX_OUTPUT_CHARS = 10_000
"""Characters of a command's output (or a file view) the model sees; the middle is cut."""
MAX_FILE_BYTES = 4 << 20
"""Largest file ``view`` and ``str_replace`` read."""
_LIST = "-mindepth 1 -maxdepth 2 -name '.*' -prune -o -printf '%y %P\\n'"

Env = Annotated[Mapping[str, str], Injected("command_env")]
SessionArg = Annotated[Session, Injected("session")]
Workdir = Annotated[str, Injected("workdir")]
_IN_FOLDER = 'cd -- "$1" || exit 1; shift; exec "$@"'


def terminal_context(
    session: Session, env: Mapping[str, str] | None = None, workdir: str = WORKDIR
) -> dict[str, Any]:
    """The tool context the terminal tools need: ``session``, ``command_env`` and ``workdir``,
    the model's current folder (``/sandbox``, or a path where ``session`` shows it again)."""
    return {"session": session, "command_env": dict(env or {}), "workdir": workdir}


def in_folder(folder: str, argv: list[str]) -> list[str]:
    """``argv`` run in ``folder``, the session's working folder or a path that shows it."""
    if folder == WORKDIR:  # a session's commands start there (an e2b session's is elsewhere)
        return argv
    return ["/bin/sh", "-c", _IN_FOLDER, "sh", folder, *argv]


@tool(name="bash")
async def bash(
    command: str,
    session: SessionArg,
    command_env: Env,
    workdir: Workdir,
    timeout: float | None = None,
) -> str:
    """Run a shell command in the task's workspace; it starts in the current folder (/sandbox,
    or the one the system prompt names). Files and background processes persist between calls
    until the episode ends. There is no network.

    Args:
        command: The command line, run by /bin/sh.
        timeout: Seconds before the command is killed (at most the session's limit).
    """
    limit = session.limits.wall_time
    wall = limit if timeout is None else min(max(timeout, 0.1), limit)
    argv = in_folder(workdir, as_argv(command))
    result = await session.arun(argv, wall_time=wall, env=dict(command_env))
    return describe_run(result, wall, limit, session.limits.output_bytes)


def describe_run(result: ExecResult, wall: float, limit: float, output_bytes: int) -> str:
    """What the model sees of a command: its status line, then its output, capped."""
    if result.stop_reason == "timeout":
        head = (
            f"[killed: the command ran past its {wall:g} s timeout (the limit is {limit:g} s); "
            "run long jobs in the background with output to a file]"
        )
    elif result.stop_reason == "output_limit":
        head = f"[killed: the command wrote more than {output_bytes} bytes of output]"
    else:
        head = f"[{result.describe()}]"
    parts = [head]
    if result.stdout:
        parts.append(result.stdout.rstrip("\n"))
    if result.stderr:
        parts.append("[stderr]\n" + result.stderr.rstrip("\n"))
    if len(parts) == 1:
        parts.append("(no output)")
    return cap_output("\n".join(parts), MAX_OUTPUT_CHARS)


@tool(name="view")
async def view(
    path: str, session: SessionArg, workdir: Workdir, view_range: list[int] | None = None
) -> str:
    """Show a text file with line numbers, or list a folder's files (two levels deep).

    Args:
        path: A file or folder: relative to the current folder, or absolute under it or
            /sandbox (the same folder).
        view_range: [first, last] line numbers to show (1-based, inclusive; last = -1 for the
            end of the file). Only for files.
    """
    relative = workspace_path(path, allow_root=True, workdir=workdir)
    try:
        data = await session.read_file(relative, max_bytes=MAX_FILE_BYTES)
    except IsADirectoryError:
        return await _listing(session, relative, path, view_range)
    except FileNotFoundError:
        raise EditError(f"{path} does not exist (view {workdir} to see the files)") from None
    shown = view_lines(path, decode_text(path, data), view_range)
    return cap_output(shown, MAX_OUTPUT_CHARS)


async def _listing(session: Session, relative: str, path: str, view_range: list[int] | None) -> str:
    if view_range:
        raise EditError(f"{path} is a folder; view_range is only for files")
    result = await session.arun(f"find {_quote(relative)} {_LIST}")
    if not result.ok:
        raise EditError(f"cannot list {path}: {result.stderr.strip()[-200:]}")
    return format_listing(path, result.stdout)


@tool(name="create")
async def create(path: str, file_text: str, session: SessionArg, workdir: Workdir) -> str:
    """Create a file with the given contents, or overwrite it; parent folders are created.

    Args:
        path: The file: relative to the current folder, or absolute under it or /sandbox (the
            same folder).
        file_text: The whole contents of the file.
    """
    relative = workspace_path(path, workdir=workdir)
    try:
        await session.write_file(relative, file_text)
    except IsADirectoryError:
        raise EditError(f"{path} is a folder; give a file path") from None
    lines = file_text.count("\n") + (not file_text.endswith("\n") and bool(file_text))
    return f"Wrote {path} ({lines} lines, {len(file_text.encode())} bytes)."


@tool(name="str_replace")
async def str_replace(
    path: str, old_str: str, new_str: str, session: SessionArg, workdir: Workdir
) -> str:
    """Replace one exact occurrence of old_str in a file by new_str. old_str must occur exactly
    once, whitespace and indentation included; add surrounding lines to make it unique.

    Args:
        path: The file: relative to the current folder, or absolute under it or /sandbox (the
            same folder).
        old_str: The exact text to replace.
        new_str: The text to put in its place (may be empty to delete it).
    """
    relative = workspace_path(path, workdir=workdir)
    try:
        data = await session.read_file(relative, max_bytes=MAX_FILE_BYTES)
    except FileNotFoundError:
        raise EditError(f"{path} does not exist; create it with the create tool") from None
    except IsADirectoryError:
        raise EditError(f"{path} is a folder; give a file path") from None
    text, line = replace_once(path, decode_text(path, data), old_str, new_str)
    await session.write_file(relative, text)
    shown = snippet(text, line, new_str.count("\n") + 1)
    return f"Edited {path} at line {line}. The lines around the edit now read:\n{shown}"


def _quote(path: str) -> str:
    return "'" + path.replace("'", "'\\''") + "'"


TERMINAL_TOOLS: tuple[Tool, ...] = (bash, view, create, str_replace)
"""The four terminal tools, in the order they are offered."""
