"""The terminal tools' text logic: paths, numbered views, exact replace, capped output."""

from __future__ import annotations

import pytest

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

TEXT = "one\ntwo\nthree\nfour\nfive\n"


def test_workspace_paths_are_relative_to_the_sandbox() -> None:
    assert workspace_path("src/a.py") == "src/a.py"
    assert workspace_path("/sandbox/src/./b/../a.py") == "src/a.py"
    with pytest.raises(EditError, match=r"'/etc/passwd' is outside the workspace"):
        workspace_path("/etc/passwd")
    with pytest.raises(EditError, match=r"'\.\./x' is outside the workspace"):
        workspace_path("../x")
    with pytest.raises(EditError, match="is the workspace folder itself"):
        workspace_path("/sandbox/")
    with pytest.raises(EditError, match="the path is empty"):
        workspace_path(" ")


def test_a_working_folder_shown_elsewhere_is_the_same_folder() -> None:
    assert workspace_path("src/a.py", workdir="/app") == "src/a.py"
    assert workspace_path("/app/src/a.py", workdir="/app") == "src/a.py"
    assert workspace_path("/sandbox/src/a.py", workdir="/app") == "src/a.py"
    assert workspace_path("/app", workdir="/app", allow_root=True) == "."
    assert workspace_path("/sandbox", workdir="/app", allow_root=True) == "."
    with pytest.raises(EditError, match=r"^'/apple/x' is outside the workspace; .* under /app "):
        workspace_path("/apple/x", workdir="/app")
    with pytest.raises(EditError, match=r"^'\.\./x' is outside the workspace; .* under /app "):
        workspace_path("../x", workdir="/app")
    with pytest.raises(EditError, match=r"^'/app/' is the workspace folder itself"):
        workspace_path("/app/", workdir="/app")
    with pytest.raises(EditError, match=r"^'/app/x' is outside the workspace; .* under /sandbox "):
        workspace_path("/app/x")


def test_views_are_numbered_and_ranges_are_checked() -> None:
    assert (
        view_lines("a.txt", TEXT)
        == "     1\tone\n     2\ttwo\n     3\tthree\n     4\tfour\n     5\tfive"
    )
    assert view_lines("a.txt", TEXT, [2, 3]) == "     2\ttwo\n     3\tthree"
    assert view_lines("a.txt", TEXT, [4, -1]) == "     4\tfour\n     5\tfive"
    assert view_lines("e.txt", "") == "e.txt is empty"
    with pytest.raises(EditError, match="view_range starts at line 9, but a.txt has 5 lines"):
        view_lines("a.txt", TEXT, [9, 10])
    with pytest.raises(EditError, match=r"ends at line 7: it must be between 2 and 5"):
        view_lines("a.txt", TEXT, [2, 7])
    with pytest.raises(EditError, match=r"view_range must be \[first, last\], got \[1\]"):
        view_lines("a.txt", TEXT, [1])


@pytest.mark.parametrize(
    ("old", "message"),
    [
        ("six", "old_str was not found in a.txt; it must match the file exactly"),
        ("o", r"old_str occurs 3 times in a.txt \(lines 1, 2, 4\); include more"),
        ("", "old_str is empty"),
    ],
)
def test_replace_refuses_an_absent_or_repeated_string(old: str, message: str) -> None:
    with pytest.raises(EditError, match=message):
        replace_once("a.txt", TEXT, old, "x")


def test_replace_changes_the_one_occurrence_and_says_where() -> None:
    new, line = replace_once("a.txt", TEXT, "three\nfour", "3\n4")
    assert (new, line) == ("one\ntwo\n3\n4\nfive\n", 3)
    assert snippet(new, line, 2) == ("     1\tone\n     2\ttwo\n     3\t3\n     4\t4\n     5\tfive")


def test_binary_files_are_refused() -> None:
    assert decode_text("a", b"caf\xc3\xa9") == "café"
    with pytest.raises(EditError, match=r"b.bin is a binary file \(3 bytes\)"):
        decode_text("b.bin", b"a\0b")
    with pytest.raises(EditError, match=r"c is not UTF-8 text \(1 bytes\)"):
        decode_text("c", b"\xff")


def test_long_output_keeps_its_head_and_tail_and_says_what_was_cut() -> None:
    assert cap_output("short", 10) == "short"
    text = "".join(str(i % 10) for i in range(100))
    assert cap_output(text, 20) == (
        "0123456789\n[... 80 characters cut here: the output had 100, and 20 are shown ...]\n"
        "0123456789"
    )


def test_listings_are_sorted_with_folders_marked() -> None:
    found = "f src/b.py\nd src\nf README.md\n"
    assert format_listing(".", found) == (
        ". (files and folders up to 2 levels deep, hidden ones left out):\n"
        "README.md\nsrc/\nsrc/b.py"
    )
    assert format_listing(".", found, limit=1).endswith("README.md\n[... and 2 more]")
    assert format_listing("e", "").endswith("\n(empty)")
