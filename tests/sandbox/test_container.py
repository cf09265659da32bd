"""The container back end on real Podman: sessions keep the Session contract (files, stdin,
limits, background processes, the caller's paths), images build from a Dockerfile as written
(a RUN apt-get step included) once per content, and no container outlives the process that
started it, however it dies."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from envhub.sandbox.base import Limits
from envhub.sandbox.container_engine import OWNER_LABEL, ContainerEngine
from envhub.sandbox.session import SessionPaths, Workspace

IMAGE = "localhost/envhub-base:bookworm"


@pytest.fixture(scope="module")
def sandbox(require_podman: None) -> Iterator[object]:
    """A container back end on Podman with the default image (``scripts/install.sh`` builds
    it)."""
    from envhub.sandbox.container import ContainerSandbox

    yield ContainerSandbox(Limits(wall_time=20), engine="podman")


def _run(coroutine: object) -> object:
    return asyncio.run(coroutine)  # type: ignore[arg-type]


def _processes(session: object) -> list[str]:
    """The command lines of the container's processes but PID 1 and the listing's own."""
    listing = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done"
    result = _run(session.arun(listing))  # type: ignore[attr-defined]
    return [line for line in result.stdout.splitlines() if "sleep" in line and "/proc" not in line]


def test_a_session_runs_in_its_copy_of_the_workspace(sandbox: object) -> None:
    workspace = Workspace.from_files({"app/main.py": "print(input()[::-1])\n", "keep.txt": "v1"})

    async def episode() -> list[object]:
        async with sandbox.session(workspace) as session:  # type: ignore[attr-defined]
            ran = await session.arun(["python3", "app/main.py"], stdin="olleh\n")
            failed = await session.arun("echo out; echo err >&2; exit 3", env={"X": "1"})
            shown = await session.arun('echo "$X" $(pwd)', env={"X": "seen"})
            await session.write_file("keep.txt", "v2")
            await session.write_file("/sandbox/new/deep.txt", b"\x00\xff")
            return [ran, failed, shown, await session.read_file("keep.txt"),
                    await session.read_file("new/deep.txt")]  # fmt: skip

    ran, failed, shown, kept, deep = _run(episode())
    assert (ran.stdout, ran.exit_code, ran.stop_reason) == ("hello\n", 0, "ok")
    assert (failed.stdout, failed.stderr, failed.exit_code) == ("out\n", "err\n", 3)
    assert shown.stdout == "seen /sandbox\n"
    assert (kept, deep) == (b"v2", b"\x00\xff")
    assert (workspace.path / "keep.txt").read_text() == "v1"  # copy-on-write: never written
    assert not (workspace.path / "new").exists()
    with pytest.raises(FileNotFoundError):
        _run(_read_in_fresh_session(sandbox, "missing.txt"))


async def _read_in_fresh_session(sandbox: object, path: str) -> bytes:
    async with sandbox.session() as session:  # type: ignore[attr-defined]
        return await session.read_file(path)


def test_limits_stop_the_call_not_the_session(sandbox: object) -> None:
    session = sandbox.session()  # type: ignore[attr-defined]
    try:
        left = _run(session.arun("sleep 300 > /dev/null 2>&1 &"))
        slow = _run(session.arun("sleep 200 & sleep 100", wall_time=1))
        after_timeout = _processes(session)
        loud = _run(session.arun("yes", wall_time=20))
        hungry = _run(session.arun(["python3", "-c", "x = bytearray(2 << 30)"]))
        offline = _run(session.arun(["python3", "-c", _CONNECT]))
        wild = _run(session.arun("kill -9 -1; sleep 5"))
        still = _run(session.arun("echo still here"))
        _run(session.akill_processes())
        after_kill = _processes(session)
    finally:
        _run(session.aclose())
    assert (left.exit_code, left.stop_reason) == (0, "ok")
    assert (slow.exit_code, slow.stop_reason) == (None, "timeout")
    # the call's group is gone with it; what an earlier call left keeps running
    assert after_timeout == ["sleep 300 "]
    assert loud.stop_reason == "output_limit" and len(loud.stdout) == 1 << 20
    assert hungry.stop_reason == "memory" and "MemoryError" in hungry.stderr
    assert offline.stdout == "unreachable\n"
    assert (wild.exit_code, wild.stop_reason) == (137, "killed")
    assert still.stdout == "still here\n"
    assert after_kill == []


_CONNECT = textwrap.dedent("""
    import socket
    try:
        socket.create_connection(("1.1.1.1", 80), timeout=5)
        print("connected")
    except OSError:
        print("unreachable")
""")


def test_the_callers_paths_are_shown(sandbox: object) -> None:
    paths = SessionPaths(workdir=("/app",), folders=("/tests", "/logs"))

    async def episode() -> object:
        async with sandbox.session(paths=paths) as session:  # type: ignore[attr-defined]
            await session.write_file("made.txt", "via /sandbox")
            return await session.arun(
                "cat /app/made.txt; echo; cd /app && pwd -P; ls -A /tests /logs; "
                "touch /tests/t /logs/l && echo writable"
            )

    shown = _run(episode())
    assert shown.stdout == "via /sandbox\n/app\n/logs:\n\n/tests:\nwritable\n"
    assert sandbox.session_path_problem("/app") is None  # type: ignore[attr-defined]


def test_one_off_runs_take_files_and_give_files_back(sandbox: object) -> None:
    result = _run(sandbox.arun_python(  # type: ignore[attr-defined]
        "open('out.txt', 'w').write(open('in.txt').read() * 2)",
        files={"in.txt": "ab"},
    ))  # fmt: skip
    assert result.ok
    copied = _run(sandbox.arun(  # type: ignore[attr-defined]
        "cp in.txt out.txt", files={"in.txt": "xy"}, output_files=["out.txt", "none.txt"]
    ))  # fmt: skip
    assert copied.files == {"out.txt": b"xy"}


def test_an_image_builds_once_from_its_dockerfile(sandbox: object, tmp_path: Path) -> None:
    (tmp_path / "data.txt").write_text("from the context\n")
    dockerfile = textwrap.dedent(f"""
        FROM {IMAGE}
        RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends jq >/dev/null
        WORKDIR /app
        COPY data.txt /app/data.txt
        RUN echo "built at $(date +%s%N)" > /app/stamp
    """)
    tag = sandbox.build(tmp_path, dockerfile)  # type: ignore[attr-defined]
    again = sandbox.build(tmp_path, dockerfile)  # type: ignore[attr-defined]
    task = sandbox.with_image(tag)  # type: ignore[attr-defined]

    async def episode() -> object:
        async with task.session(paths=SessionPaths(workdir=("/app",))) as session:
            return await session.arun("echo '{\"a\": 7}' | jq .a; cat data.txt; cat stamp")

    first = _run(episode())
    second = _run(episode())
    assert again == tag and tag.startswith("localhost/envhub-build:")
    assert first.stdout.splitlines()[:2] == ["7", "from the context"]
    assert first.stdout == second.stdout  # the same image: the stamp of its one build
    (tmp_path / "data.txt").write_text("changed\n")
    assert sandbox.build(tmp_path, dockerfile) != tag  # type: ignore[attr-defined]


_OWNER = textwrap.dedent("""
    import asyncio, sys
    from envhub.sandbox.container import ContainerSandbox

    async def main():
        session = ContainerSandbox(engine="podman").session()
        await session.arun("true")
        print(session.name, flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
""")


def _containers(engine: ContainerEngine, name: str) -> list[str]:
    return engine.call("ps", "-a", "-q", "--filter", f"name={name}").split()


def test_a_killed_process_leaves_no_container(sandbox: object) -> None:
    engine = ContainerEngine("podman")
    owner = subprocess.Popen([sys.executable, "-c", _OWNER], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    name = owner.stdout.readline().strip()
    assert name.startswith("envhub-") and _containers(engine, name)
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    deadline = time.monotonic() + 30  # the reaper takes ~1 s; this catches a hang
    while _containers(engine, name) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _containers(engine, name) == []


def test_a_sweep_removes_containers_of_gone_owners(
    sandbox: object, caplog: pytest.LogCaptureFixture
) -> None:
    from envhub.sandbox.container import sweep_containers

    engine = ContainerEngine("podman")
    mine = f"{OWNER_LABEL}={sandbox.owner}"  # type: ignore[attr-defined]
    flags = engine.run_flags(64)
    gone = engine.call("create", f"--label={OWNER_LABEL}=1:0", *flags, IMAGE, "true").strip()
    live = engine.call("create", f"--label={mine}", *flags, IMAGE, "true").strip()
    try:
        with caplog.at_level("WARNING"):
            removed = sweep_containers(engine)
        assert gone in removed and live not in removed
        assert f"removing container {gone[:12]} left by process 1:0 (gone)" in caplog.text
        assert (
            _containers(engine, gone) == []
            and engine.call("ps", "-a", "-q", "--no-trunc", "--filter", f"id={live}").strip()
        )
    finally:
        engine.remove([gone, live])
