"""files_digest: sessions that hold the same files share a digest, any change a command can make
shows in it, and a session whose files cannot all be read, or whose backend cannot say where
commands write, has none. Commands of a local session write nowhere but its writable roots."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Iterator

import pytest

from envhub.sandbox import Limits, LocalSandbox, Workspace, bwrap_problem
from envhub.sandbox.digest import files_digest

from .conftest import live_sandbox_processes

pytestmark = pytest.mark.skipif(
    bwrap_problem() is not None or os.geteuid() != 0,
    reason="local sessions need bubblewrap and root",
)


@pytest.fixture(scope="module")
def box() -> Iterator[LocalSandbox]:
    with LocalSandbox(Limits(wall_time=10), base_uid=61900, max_concurrency=4, warm=0) as sandbox:
        yield sandbox
        assert live_sandbox_processes(sandbox) == []


@pytest.fixture(scope="module")
def workspace() -> Iterator[Workspace]:
    ws = Workspace.from_files({"README": "hello\n", "src/app.py": "print('app')\n"})
    yield ws
    ws.remove()


def digest_after(
    box: LocalSandbox, workspace: Workspace, command: str = "", roots: object = ...
) -> str | None:
    """The digest of a fresh session's files after ``command`` (and its processes) ran."""

    async def run() -> str | None:
        async with box.session(workspace) as session:
            if roots is not ...:
                session.writable_roots = roots
            if command:
                await session.arun(command)
            await session.akill_processes()
            return await files_digest(session)

    return asyncio.run(run())


CHANGES = [
    "echo bye > README",
    "echo hello > README",  # the same bytes, written again: a file's time counts
    "touch -d 2001-01-01 README",
    "chmod 600 README",
    "mkdir empty",
    "mkdir -p src/__pycache__",
    "mv src/app.py src/main.py",
    "rm README",
    "ln -s README link",
    "ln -s src link",
    "mkfifo pipe",
    "echo x > /tmp/x",
    "mkdir /tmp/x",
    "echo x > '/tmp/two\nlines'",
    "echo x > /dev/shm/x",
    "(sleep 600; echo late > README) & echo started",
]


def test_the_same_files_share_a_digest_and_every_change_shows(box, workspace) -> None:
    untouched = digest_after(box, workspace)
    assert re.fullmatch(r"[0-9a-f]{64}", untouched)
    assert digest_after(box, workspace) == untouched
    assert digest_after(box, workspace, "cat README src/app.py; ls -la /tmp") == untouched
    changed = [digest_after(box, workspace, command) for command in CHANGES]
    # The process left running wrote nothing before it was ended: nothing changed.
    assert changed[-1] == untouched
    assert None not in changed and untouched not in changed[:-1]
    assert len(set(changed[:-1])) == len(CHANGES) - 1


def test_no_digest_without_every_file_read_or_without_known_writable_roots(box, workspace):
    assert digest_after(box, workspace, "echo secret > key; chmod 000 key") is None
    assert digest_after(box, workspace, "mkdir locked; chmod 000 locked") is None
    assert digest_after(box, workspace, roots=None) is None


def test_commands_of_a_session_write_nowhere_but_its_writable_roots(box, workspace) -> None:
    folders = "/ /usr /etc /dev/pts /var /var/tmp /run /home /root /opt /mnt /srv /proc/self /sys"

    async def run() -> str:
        async with box.session(workspace) as session:
            assert session.writable_roots == ("/sandbox", "/tmp", "/dev")
            script = f"for d in {folders}; do touch $d/probe 2>/dev/null && echo $d; done"
            script += "; touch /sandbox/probe /tmp/probe /dev/probe /dev/shm/probe && echo roots"
            return (await session.arun(["/bin/sh", "-c", script])).stdout

    assert asyncio.run(run()) == "roots\n"
