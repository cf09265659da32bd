"""The terminal tools on real bubblewrap sessions: exact replies, capped output, line ranges,
str_replace with 0/1/2 matches, model mistakes as tool errors, state within a session only."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

import pytest

from envhub.sandbox import Limits, LocalSandbox, Workspace, bwrap_problem
from envhub.sandbox.base import WORKDIR
from envhub.sandbox.session import SessionPaths
from envhub.tools.executor import ToolExecutor
from envhub.tools.parsers import ParsedTurn
from envhub.tools.terminal import MAX_OUTPUT_CHARS, TERMINAL_TOOLS, terminal_context
from envhub.tools.text_edits import EditError
from envhub.types import ToolCall

pytestmark = pytest.mark.skipif(
    bwrap_problem() is not None or os.geteuid() != 0,
    reason="local sessions need bubblewrap and root",
)
TOOLS = {t.name: t for t in TERMINAL_TOOLS}
FILES = {"notes.txt": "alpha\nbeta\ngamma\nbeta\n", "src/app.py": "print('app')\n"}


@pytest.fixture(scope="module")
def box() -> Iterator[LocalSandbox]:
    with LocalSandbox(Limits(wall_time=2, processes=16), base_uid=61400, warm=0) as sandbox:
        yield sandbox


@pytest.fixture(scope="module")
def workspace() -> Iterator[Workspace]:
    ws = Workspace.from_files(FILES)
    yield ws
    ws.remove()


def run_calls(
    box: LocalSandbox, workspace: Workspace, *calls: tuple[str, dict], workdir: str = WORKDIR
) -> list[Any]:
    """Each call's reply (or the EditError it raised), in one session whose working folder is
    shown again at ``workdir`` (when it is not ``/sandbox``), the model's current folder."""
    paths = SessionPaths(workdir=(workdir,) if workdir != WORKDIR else ())

    async def go() -> list[Any]:
        replies: list[Any] = []
        async with box.session(workspace, paths=paths) as session:
            context = terminal_context(session, workdir=workdir)
            for name, arguments in calls:
                try:
                    replies.append(await TOOLS[name].acall(arguments, context))
                except EditError as e:
                    replies.append(e)
        return replies

    return asyncio.run(go())


def test_the_schemas_name_what_the_model_gives() -> None:
    params = {name: t.parameters for name, t in TOOLS.items()}
    assert list(TOOLS) == ["bash", "view", "create", "str_replace"]
    assert {n: sorted(p["properties"]) for n, p in params.items()} == {
        "bash": ["command", "timeout"],
        "view": ["path", "view_range"],
        "create": ["file_text", "path"],
        "str_replace": ["new_str", "old_str", "path"],
    }
    assert {n: sorted(p["required"]) for n, p in params.items()} == {
        "bash": ["command"],
        "view": ["path"],
        "create": ["file_text", "path"],
        "str_replace": ["new_str", "old_str", "path"],
    }


def test_bash_shows_the_exit_code_stdout_and_stderr(box: LocalSandbox, workspace) -> None:
    replies = run_calls(
        box,
        workspace,
        ("bash", {"command": "ls; echo oops >&2; exit 3"}),
        ("bash", {"command": "true"}),
        ("bash", {"command": "pwd"}),
    )
    assert replies == [
        "[exit 3]\nnotes.txt\nsrc\n[stderr]\noops",
        "[exit 0]\n(no output)",
        "[exit 0]\n/sandbox",
    ]


def test_bash_timeouts_are_capped_by_the_session_limit(box: LocalSandbox, workspace) -> None:
    short, capped = run_calls(
        box,
        workspace,
        ("bash", {"command": "sleep 5", "timeout": 0.2}),
        ("bash", {"command": "sleep 5", "timeout": 1000}),
    )
    assert short.startswith("[killed: the command ran past its 0.2 s timeout (the limit is 2 s)")
    assert capped.startswith("[killed: the command ran past its 2 s timeout (the limit is 2 s)")


def test_long_output_is_cut_and_the_cut_is_said(box: LocalSandbox, workspace) -> None:
    (reply,) = run_calls(box, workspace, ("bash", {"command": "seq 1 20000"}))
    everything = "[exit 0]\n" + "\n".join(str(i) for i in range(1, 20001))
    cut = len(everything) - MAX_OUTPUT_CHARS
    assert reply.startswith("[exit 0]\n1\n2\n3\n")
    assert reply.endswith("\n19999\n20000")
    note = (
        f"[... {cut} characters cut here: the output had {len(everything)}, "
        f"and {MAX_OUTPUT_CHARS} are shown ...]"
    )
    assert note in reply
    assert len(reply) == MAX_OUTPUT_CHARS + len(note) + 2


def test_view_numbers_lines_takes_ranges_and_lists_folders(box: LocalSandbox, workspace) -> None:
    whole, part, folder, root = run_calls(
        box,
        workspace,
        ("view", {"path": "notes.txt"}),
        ("view", {"path": "/sandbox/notes.txt", "view_range": [2, 3]}),
        ("view", {"path": "src"}),
        ("view", {"path": "/sandbox"}),
    )
    assert whole == "     1\talpha\n     2\tbeta\n     3\tgamma\n     4\tbeta"
    assert part == "     2\tbeta\n     3\tgamma"
    assert folder == "src (files and folders up to 2 levels deep, hidden ones left out):\napp.py"
    assert root.endswith(":\nnotes.txt\nsrc/\nsrc/app.py")


def test_str_replace_with_zero_one_and_two_matches(box: LocalSandbox, workspace) -> None:
    absent, twice, once, after = run_calls(
        box,
        workspace,
        ("str_replace", {"path": "notes.txt", "old_str": "delta", "new_str": "x"}),
        ("str_replace", {"path": "notes.txt", "old_str": "beta", "new_str": "x"}),
        ("str_replace", {"path": "notes.txt", "old_str": "gamma\nbeta", "new_str": "G\nB"}),
        ("view", {"path": "notes.txt"}),
    )
    assert str(absent).startswith("old_str was not found in notes.txt; it must match the file")
    assert str(twice) == (
        "old_str occurs 2 times in notes.txt (lines 2, 4); include more of the surrounding "
        "lines to make it unique"
    )
    assert once == (
        "Edited notes.txt at line 3. The lines around the edit now read:\n"
        "     1\talpha\n     2\tbeta\n     3\tG\n     4\tB"
    )
    assert after == "     1\talpha\n     2\tbeta\n     3\tG\n     4\tB"


def test_create_writes_files_that_later_calls_see(box: LocalSandbox, workspace) -> None:
    created, ran, viewed = run_calls(
        box,
        workspace,
        ("create", {"path": "pkg/mod.py", "file_text": "X = 41\nprint(X + 1)\n"}),
        ("bash", {"command": "python3 pkg/mod.py"}),
        ("view", {"path": "pkg/mod.py", "view_range": [2, -1]}),
    )
    assert created == "Wrote pkg/mod.py (2 lines, 20 bytes)."
    assert (ran, viewed) == ("[exit 0]\n42", "     2\tprint(X + 1)")


def test_files_never_cross_sessions_of_one_workspace(box: LocalSandbox, workspace) -> None:
    first = run_calls(box, workspace, ("create", {"path": "mine.txt", "file_text": "1\n"}))
    second = run_calls(box, workspace, ("bash", {"command": "ls"}))
    assert first == ["Wrote mine.txt (1 lines, 2 bytes)."]
    assert second == ["[exit 0]\nnotes.txt\nsrc"]
    assert sorted(p.name for p in workspace.path.iterdir()) == ["notes.txt", "src"]


def test_the_tools_take_the_folder_the_session_shows_again(box: LocalSandbox, workspace) -> None:
    """With the working folder shown at /app and /app the current folder, /app/x and
    /sandbox/x are one file to every tool, and commands start in /app."""
    replies = run_calls(
        box,
        workspace,
        ("bash", {"command": "pwd; ls"}),
        ("create", {"path": "/app/new.txt", "file_text": "one\n"}),
        ("view", {"path": "/sandbox/new.txt"}),
        ("str_replace", {"path": "/app/notes.txt", "old_str": "alpha", "new_str": "A"}),
        ("view", {"path": "notes.txt", "view_range": [1, 2]}),
        ("view", {"path": "/app"}),
        ("bash", {"command": "cat /sandbox/new.txt /app/notes.txt | head -2"}),
        ("create", {"path": "/app/../apple/x", "file_text": ""}),
        ("view", {"path": "/nothing.txt"}),
        workdir="/app",
    )
    assert [str(r) for r in replies] == [
        "[exit 0]\n/app\nnotes.txt\nsrc",
        "Wrote /app/new.txt (1 lines, 4 bytes).",
        "     1\tone",
        "Edited /app/notes.txt at line 1. The lines around the edit now read:\n"
        "     1\tA\n     2\tbeta\n     3\tgamma\n     4\tbeta",
        "     1\tA\n     2\tbeta",
        "/app (files and folders up to 2 levels deep, hidden ones left out):\n"
        "new.txt\nnotes.txt\nsrc/\nsrc/app.py",
        "[exit 0]\none\nA",
        "'/app/../apple/x' is outside the workspace; files are edited under /app (use bash to "
        "read other files)",
        "'/nothing.txt' is outside the workspace; files are edited under /app (use bash to "
        "read other files)",
    ]


def test_model_mistakes_are_tool_errors(box: LocalSandbox, workspace) -> None:
    replies = run_calls(
        box,
        workspace,
        ("bash", {"command": "printf 'a\\0b' > blob.bin"}),
        ("view", {"path": "blob.bin"}),
        ("view", {"path": "missing.txt"}),
        ("view", {"path": "/etc/passwd"}),
        ("view", {"path": "src", "view_range": [1, 2]}),
        ("view", {"path": "notes.txt", "view_range": [3, 9]}),
        ("str_replace", {"path": "missing.py", "old_str": "a", "new_str": "b"}),
        ("create", {"path": "src", "file_text": "x"}),
        ("create", {"path": "/app/new.txt", "file_text": "x"}),  # no folder shown at /app
    )
    assert [str(r) for r in replies[1:]] == [
        "blob.bin is a binary file (3 bytes); only text files are shown",
        "missing.txt does not exist (view /sandbox to see the files)",
        "'/etc/passwd' is outside the workspace; files are edited under /sandbox "
        "(use bash to read other files)",
        "src is a folder; view_range is only for files",
        "view_range ends at line 9: it must be between 3 and 4 (the last line of notes.txt), "
        "or -1 for the end",
        "missing.py does not exist; create it with the create tool",
        "src is a folder; give a file path",
        "'/app/new.txt' is outside the workspace; files are edited under /sandbox "
        "(use bash to read other files)",
    ]


def test_the_executor_shows_errors_and_missing_arguments_to_the_model(
    box: LocalSandbox, workspace
) -> None:
    calls = [
        ToolCall.make("c1", "str_replace", {"path": "notes.txt", "old_str": "beta"}),
        ToolCall.make("c2", "str_replace", {"path": "notes.txt", "old_str": "a", "new_str": ""}),
    ]

    async def go() -> list[Any]:
        async with box.session(workspace) as session:
            executor = ToolExecutor(TOOLS)
            return await executor.run(ParsedTurn("", calls), terminal_context(session))

    missing, repeated = asyncio.run(go())
    assert (missing.error, missing.message.content) == (
        "invalid_arguments",
        "Error: invalid arguments for str_replace: missing required argument 'new_str'",
    )
    assert (repeated.error, repeated.message.content) == (
        "tool_error",
        "Error: str_replace raised EditError: old_str occurs 6 times in notes.txt "
        "(lines 1, 2, 3, 4); include more of the surrounding lines to make it unique",
    )
