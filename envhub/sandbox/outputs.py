"""Output files: how a finished run hands files back through a pipe.

The working folder is a tmpfs that vanishes with the sandbox, so after the command ends the
sandbox's init (a small ``/bin/sh`` script, pid 1 of the sandbox) kills whatever the command
left running and writes each requested file to a pipe the host reads: ``name\\n size\\n bytes``
per file.
The files are the program's own output (untrusted, like its stdout); nothing here is used to
decide whether code passed a test.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from envhub.errors import ConfigError

INIT = """\
"$@"
status=$?
"""
_KILL_ALL = "kill -9 -1 2>/dev/null\n"
_EMIT = (
    'emit() {{ if [ -f "$1" ] && [ ! -L "$1" ]; then '
    """printf '%s\\n%s\\n' "$1" "$(wc -c < "$1")"; cat "$1"; fi; }}\n"""
    "{{ {emits} }} > {channel}\n"
)
_EMIT_ALL = (
    'find . -path ./.tmp -prune -o -type f -print | while IFS= read -r f; do emit "${f#./}"; done'
)
ALL_FILES = "**"
"""Ask for this as the only output file to get every file of the working folder back."""


def init_script(
    wanted: Sequence[str] = (),
    channel: str | None = None,
    *,
    kill_all: bool = True,
    prologue: str = "",
) -> str:
    """The ``sh -c`` script that runs ``"$@"`` as the sandbox's pid 1 would: it runs
    ``prologue`` (the rlimits, when the init sets them), waits for the command, kills whatever
    the command left behind (``kill -9 -1``: every process its uid may signal, so only where
    that uid is the sandbox's alone), sends the ``wanted`` files to ``channel`` (when given)
    and exits with the command's status (``128 + n`` for signal n)."""
    for path in wanted:
        if "\n" in path:
            raise ConfigError(f"output file names cannot contain a newline: {path!r}")
    script = prologue + INIT + (_KILL_ALL if kill_all else "")
    if wanted and channel:
        emits = (
            _EMIT_ALL + ";"
            if list(wanted) == [ALL_FILES]
            else " ".join(f"emit {shlex.quote(path)};" for path in wanted)
        )
        script += _EMIT.format(emits=emits, channel=shlex.quote(channel))
    return script + "exit $status\n"


def frame(files: Mapping[str, bytes]) -> bytes:
    """Files in the format the epilogue writes."""
    return b"".join(f"{name}\n{len(data)}\n".encode() + data for name, data in files.items())


def parse_outputs(data: bytes, wanted: Sequence[str]) -> dict[str, bytes]:
    """Files from the epilogue's stream; stops at the first record that does not fit (a
    program that wrote into the pipe itself garbles only what follows)."""
    files: dict[str, bytes] = {}
    allowed, position = set(wanted), 0
    any_name = list(wanted) == [ALL_FILES]
    while position < len(data):
        name_end = data.find(b"\n", position)
        size_end = data.find(b"\n", name_end + 1) if name_end >= 0 else -1
        if size_end < 0:
            break
        name = data[position:name_end].decode("utf-8", errors="replace")
        size_text = data[name_end + 1 : size_end].strip()
        if (
            (name not in allowed and not (any_name and _inside(name)))
            or name in files
            or not size_text.isdigit()
        ):
            break
        size = int(size_text)
        body = data[size_end + 1 : size_end + 1 + size]
        if len(body) != size:
            break
        files[name] = body
        position = size_end + 1 + size
    return files


def _inside(name: str) -> bool:
    parts = name.split("/")
    return bool(name) and not name.startswith("/") and all(p not in ("", ".", "..") for p in parts)
