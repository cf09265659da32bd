"""Sessions on the local backend: state lives for a session and no longer, the workspace is
never written, what a session leaves running ends with it (even when its caller is killed),
and the containment of one-shot runs holds inside a session, across calls too."""

from __future__ import annotations

import asyncio
import functools
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from envhub.errors import ConfigError, SandboxError
from envhub.sandbox import Limits, LocalSandbox, Workspace, bwrap_problem
from envhub.sandbox.jail import Jail, shown_path_problem
from envhub.sandbox.local_session import LocalSession
from envhub.sandbox.session import SessionPaths, sandbox_path
from envhub.sandbox.session_init_c import compiled_init
from envhub.sandbox.uids import keeper_uid

from .conftest import live_sandbox_processes
from .test_containment import FORK_COUNT

REPO = Path(__file__).resolve().parents[2]
LIMITS = Limits(wall_time=5, processes=16)
pytestmark = pytest.mark.skipif(
    bwrap_problem() is not None or os.geteuid() != 0,
    reason="local sessions need bubblewrap and root",
)


@pytest.fixture(
    scope="module",
    params=[(True, "compiled"), (True, "python"), (False, "python")],
    ids=["compiled", "joined-python", "own-init-python"],
)
def box(request: pytest.FixtureRequest) -> Iterator[LocalSandbox]:
    """Sessions with the compiled init (the default where ``cc`` builds it: the sandbox's pid 1),
    and with the Python one (``ENVHUB_SESSION_INIT=python``): forked into them by a zygote (the
    default as root), or their own pid 1 (``zygote=False``)."""
    zygote, init = request.param
    with pytest.MonkeyPatch.context() as patch:
        if init == "python":
            patch.setenv("ENVHUB_SESSION_INIT", "python")
        compiled_init.cache_clear()
        if init == "compiled" and compiled_init() is None:
            pytest.skip("no C compiler here: sessions run the Python init")
        with LocalSandbox(
            LIMITS, base_uid=61300, max_concurrency=6, warm=0, zygote=zygote
        ) as sandbox:
            yield sandbox
            assert live_sandbox_processes(sandbox) == []
    compiled_init.cache_clear()


@pytest.fixture
def workspace() -> Iterator[Workspace]:
    files = {"README": "hello\n", "src/app.py": "print('app')\n", "src/data.txt": "1 2 3\n"}
    ws = Workspace.from_files(files)
    yield ws
    ws.remove()


def in_a_loop(test: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """Run an async test on a fresh event loop (the suite has no async plugin)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))  # type: ignore[arg-type]

    return run


def snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"<dir>"
        for p in sorted(folder.rglob("*"))
    }


def python(code: str) -> list[str]:
    return ["python3", "-c", code]


@in_a_loop
async def test_files_persist_across_calls_and_not_across_sessions(
    box: LocalSandbox, workspace: Workspace
) -> None:
    before = snapshot(workspace.path)
    async with box.session(workspace) as first, box.session(workspace) as second:
        await first.arun("echo more >> README && rm src/data.txt && mkdir new && echo x > new/f")
        await first.write_file("written.bin", b"\x00\xff")
        listing = await first.arun("cat README; ls -A . src new; cat written.bin | wc -c")
        assert listing.stdout == "hello\nmore\n.:\nREADME\nnew\nsrc\nwritten.bin\n\n" + (
            "new:\nf\n\nsrc:\napp.py\n2\n"
        )
        assert await first.read_file("/sandbox/new/f") == b"x\n"
        other = await second.arun("cat README; ls -A . src")
        assert other.stdout == "hello\n.:\nREADME\nsrc\n\nsrc:\napp.py\ndata.txt\n"
    assert snapshot(workspace.path) == before
    async with box.session(workspace) as third:  # a later sample starts from the workspace again
        assert (await third.arun("cat README; ls")).stdout == "hello\nREADME\nsrc\n"


@in_a_loop
async def test_workspace_files_are_the_sessions_own(
    box: LocalSandbox, workspace: Workspace
) -> None:
    async with box.session(workspace) as session:
        result = await session.arun(
            "stat -c '%u %a' README src src/app.py && chmod 700 src/app.py && "
            "stat -c %a src/app.py && git init -q && git add -A && "
            "git -c user.email=a@b -c user.name=n commit -qm x && git log --format=%s"
        )
        assert result.stdout == f"{session.uid} 644\n{session.uid} 755\n{session.uid} 644\n700\nx\n"
    assert (workspace.path / "src/app.py").stat().st_mode & 0o777 == 0o644
    assert not (workspace.path / ".git").exists()


@in_a_loop
async def test_an_empty_session_and_a_copied_one(box: LocalSandbox, workspace: Workspace) -> None:
    async with box.session() as empty:
        assert (await empty.arun("ls -A; pwd; id -u")).stdout == f"/sandbox\n{empty.uid}\n"
    async with box.session(workspace.path, start="copy") as copied:
        result = await copied.arun("echo y >> README && cat README && stat -c %u README")
        assert result.stdout == f"hello\ny\n{copied.uid}\n"
    assert (workspace.path / "README").read_text() == "hello\n"


TASK_PATHS = SessionPaths(workdir=("/app",), folders=("/tests", "/logs"))
"""Where a container task expects its files: its working folder, its tests, its logs."""


@in_a_loop
async def test_a_session_shows_its_folder_and_more_at_the_paths_asked(
    box: LocalSandbox, workspace: Workspace
) -> None:
    async with box.session(workspace, paths=TASK_PATHS) as session:
        made = await session.arun(
            "echo 3 > /app/count.txt && cat count.txt /app/README && ls -A /tests /logs && "
            "echo t > /tests/t.sh && mkdir -p /logs/verifier && stat -c '%n %u %a' /app /tests"
        )
        owner = f"{session.uid} 755"
        assert made.stdout == f"3\nhello\n/logs:\n\n/tests:\n/app {owner}\n/tests {owner}\n"
        assert await session.read_file("count.txt") == b"3\n"
        assert session.writable_roots == ("/sandbox", "/tmp", "/dev", "/tests", "/logs")
        assert (await session.arun("touch /elsewhere")).exit_code == 1  # the root stays read-only
    async with box.session(workspace, paths=TASK_PATHS) as later:  # nothing carries over
        listing = await later.arun("ls -A /tests /logs; ls /app")
        assert listing.stdout == "/logs:\n\n/tests:\nREADME\nsrc\n"
    async with box.session(workspace) as plain:
        assert (await plain.arun("ls /app /tests")).exit_code == 2


@in_a_loop
async def test_shown_folders_count_in_the_sessions_disk(box: LocalSandbox) -> None:
    async with box.session(limits=LIMITS.with_(disk_mb=2), paths=TASK_PATHS) as session:
        fill = "head -c 1500000 /dev/zero > /tests/a && head -c 1500000 /dev/zero > /sandbox/b"
        full = await session.arun(fill)
        assert (full.exit_code, full.stderr.strip()[-23:]) == (1, "No space left on device")


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/usr/src/app", "/usr/src/app is /usr or inside it, which every sandbox has"),
        ("/tmp/tests", "/tmp/tests is /tmp or inside it, which every sandbox has"),
        ("/sandbox", "/sandbox is /sandbox or inside it, which every sandbox has"),
        ("/etc/app", "/etc/app is /etc or inside it, which every sandbox has"),
        ("/.app", "/.app: hidden names at the top of a sandbox are envhub's own"),
    ],
)
def test_paths_the_sandbox_has_cannot_be_shown(box: LocalSandbox, path: str, why: str) -> None:
    assert box.session_path_problem(path) == why
    with pytest.raises(ConfigError) as refused:
        box.session(paths=SessionPaths(folders=(path,)))
    assert str(refused.value) == f"a local session cannot show {path}: {why}"
    assert box.session_path_problem("/opt/app") is None


def test_a_shown_path_may_not_hide_a_read_only_bind() -> None:
    jail = Jail("bwrap", as_root=True, ro_binds=("/var/tmp/bundle",))
    assert shown_path_problem(jail, "/var") == (
        "/var meets /var/tmp/bundle, which the sandbox mounts read-only"
    )
    assert shown_path_problem(jail, "/var/tmp/bundle/x") == (
        "/var/tmp/bundle/x meets /var/tmp/bundle, which the sandbox mounts read-only"
    )
    assert shown_path_problem(jail, "/var/app") is None


@pytest.mark.parametrize(
    ("workdir", "folders", "message"),
    [
        (("app",), (), "absolute and normalized, got 'app'"),
        (("/a/../app",), (), "absolute and normalized, got '/a/../app'"),
        (("/",), (), "absolute and normalized, got '/'"),
        (("/app",), ("/app/tests",), "must not repeat or nest: '/app' in"),
        (("/app",), ("/app",), "must not repeat or nest: '/app' in"),
    ],
)
def test_session_paths_are_absolute_and_apart(workdir, folders, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        SessionPaths(workdir=workdir, folders=folders)


@in_a_loop
async def test_read_and_write_file_errors(box: LocalSandbox) -> None:
    async with box.session() as session:
        with pytest.raises(FileNotFoundError):
            await session.read_file("missing.txt")
        await session.arun("mkdir d && mkfifo pipe")
        with pytest.raises(IsADirectoryError):
            await session.read_file("d")
        with pytest.raises(IsADirectoryError):
            await session.write_file("d", "x")
        with pytest.raises(SandboxError, match="not a regular file"):
            await session.read_file("pipe")  # a FIFO would block a plain read for ever
        await session.write_file("big", b"x" * 5000)
        with pytest.raises(SandboxError, match="larger than 4096 bytes"):
            await session.read_file("big", max_bytes=4096)
        with pytest.raises(ConfigError, match="inside /sandbox"):
            await session.read_file("../etc/passwd")
    assert sandbox_path("a/../b") == "/sandbox/b" and sandbox_path("/sandbox") == "/sandbox"


@in_a_loop
async def test_background_processes_are_counted_and_end_with_the_session(
    box: LocalSandbox,
) -> None:
    session = box.session()
    started = await session.arun("sleep 300 & nohup sleep 300 >/dev/null 2>&1 & echo started")
    assert (started.stdout, started.stop_reason) == ("started\n", "ok")
    assert isinstance(session, LocalSession) and session.uid is not None
    uid, pids = session.uid, session.processes()
    assert len(pids) == 2 and all(_uid_of(pid) == uid for pid in pids)
    # They count against the session's process limit (16: the init, 2 sleepers, python...).
    result = await session.arun(python(FORK_COUNT))
    assert result.stdout == "12 11\n"
    await session.aclose()
    await session.aclose()  # twice is fine
    assert live_sandbox_processes([uid]) == [] and session.processes() == []
    with pytest.raises(SandboxError, match="closed"):
        await session.arun("true")


@in_a_loop
async def test_kill_processes_keeps_the_session(box: LocalSandbox) -> None:
    async with box.session() as session:
        await session.arun("sleep 300 & sleep 300 & echo keep > f")
        assert len(session.processes()) == 2
        await session.akill_processes()
        assert session.processes() == []
        assert (await session.arun("cat f")).stdout == "keep\n"


@in_a_loop
async def test_killing_interpreters_by_name_spares_the_init(box: LocalSandbox) -> None:
    async with box.session() as session:
        await session.arun("sleep 300 &")
        kills = (
            "pkill python",
            "pkill -f python",
            "killall python3",
            "pkill -f sh",
            "pkill -f bash",
        )
        for kill in kills:
            await session.arun(kill)
        assert (await session.arun("echo alive")).stdout == "alive\n"


INSPECT_INIT = """\
import ctypes, os
pids = [p for p in os.listdir('/proc') if p.isdigit()]
init = next(p for p in pids if open(f'/proc/{p}/comm').read() == 'envhub-init\\n')
libc = ctypes.CDLL(None, use_errno=True)
print(libc.ptrace(16, int(init), 0, 0), ctypes.get_errno())  # PTRACE_ATTACH: EPERM
for name in ('environ', 'fd', 'mem'):
    try:
        path = f'/proc/{init}/{name}'
        os.listdir(path) if name == 'fd' else open(path, 'rb').read(1)
        print(name, 'open')
    except OSError as e:
        print(name, e.errno)
"""


@in_a_loop
async def test_calls_of_one_session_run_one_after_another(box: LocalSandbox) -> None:
    async with box.session() as session:
        calls = [session.arun(f"sleep 0.{3 - i}; echo {i} >> order") for i in range(3)]
        await asyncio.gather(*calls)
        assert (await session.arun("cat order")).stdout == "0\n1\n2\n"


@in_a_loop
async def test_a_cancelled_call_ends_and_the_session_goes_on(box: LocalSandbox) -> None:
    async with box.session() as session:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(session.arun("echo started > f; sleep 300"), 0.5)
        assert session.processes() == []
        assert (await session.arun("cat f")).stdout == "started\n"


KILL_THE_INIT = (
    "for p in /proc/[0-9]*; do"
    ' if [ "$(cat $p/comm)" = envhub-init ]; then echo ${p#/proc/}; kill -9 ${p#/proc/}; fi;'
    " done 2>/dev/null; sleep 0.1"
)
"""A call that finds the init by its name in ``/proc`` and SIGKILLs it."""


@in_a_loop
async def test_no_call_can_kill_the_init(box: LocalSandbox) -> None:
    session = box.session()
    await session.arun("sleep 300 & echo kept > f")
    assert isinstance(session, LocalSession) and session._running is not None
    uid, running = session.uid, session._running
    # pid 1 gets no signal from inside its namespace; a joined init (pid 2) has a real uid of
    # its own (the keeper's), so the calls' signals are refused
    joined = running.server_pid is not None
    assert joined == (box.zygote and compiled_init() is None)
    init = running.server_pid if joined else running.init_pid
    if joined:
        assert _uid_of(init) == keeper_uid(box.uids.base) != uid  # type: ignore[arg-type]
    everything = await session.arun("kill -9 -1 2>/dev/null; echo survived")  # all but itself
    assert (everything.stdout, everything.exit_code) == ("survived\n", 0)
    found = await session.arun(KILL_THE_INIT)
    assert (found.stdout, session.processes()) == ("2\n" if joined else "1\n", [])
    assert (await session.arun("cat f; echo alive")).stdout == "kept\nalive\n"
    assert _alive(init)  # type: ignore[arg-type]
    await session.aclose()
    assert live_sandbox_processes([uid]) == [] and not _alive(init)  # type: ignore[arg-type]


@in_a_loop
async def test_calls_cannot_inspect_or_trace_the_init(box: LocalSandbox) -> None:
    async with box.session() as session:
        result = await session.arun(python(INSPECT_INIT))
        assert result.stdout == "-1 1\nenviron 13\nfd 13\nmem 13\n"
        assert (await session.arun("echo alive")).stdout == "alive\n"


@in_a_loop
async def test_a_bad_workspace_is_a_clear_error(box: LocalSandbox, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="existing directory"):
        box.session(tmp_path / "missing")
    gone = tmp_path / "gone"
    gone.mkdir()
    session = box.session(gone)
    gone.rmdir()
    with pytest.raises(SandboxError, match="could not start.*gone"):
        await session.arun("true")
    await session.aclose()


@in_a_loop
async def test_limits_hold_per_call_and_the_session_survives_a_kill(box: LocalSandbox) -> None:
    async with box.session(limits=LIMITS.with_(output_bytes=1000, memory_mb=256)) as session:
        await session.arun("echo before > state")
        slow = await session.arun("echo partial; sleep 30", wall_time=0.5)
        assert (slow.stdout, slow.exit_code, slow.stop_reason) == ("partial\n", None, "timeout")
        loud = await session.arun("yes")
        assert (len(loud.stdout), loud.stop_reason) == (1000, "output_limit")
        hungry = await session.arun(python("a = []\nwhile True:\n    a.append(b' ' * 10**6)"))
        assert (hungry.exit_code, hungry.stop_reason) == (1, "memory")
        spin = await session.arun(python("while True:\n    pass"), wall_time=0.5)
        assert spin.stop_reason == "timeout"
        assert session.processes() == []  # the killed calls' process groups are gone
        after = await session.arun("cat state", stdin="ignored")
        assert (after.stdout, after.exit_code) == ("before\n", 0)
        echo = await session.arun(["cat"], stdin=b"x" * 300_000, wall_time=5)
        assert echo.stop_reason == "output_limit"
    async with box.session(limits=LIMITS.with_(wall_time=10, cpu_time=1)) as session:
        busy = await session.arun(python("while True:\n    pass"))
        assert (busy.exit_code, busy.stop_reason) == (128 + signal.SIGXCPU, "timeout")


@in_a_loop
async def test_stdin_env_exit_codes_and_missing_programs(box: LocalSandbox) -> None:
    async with box.session() as session:
        result = await session.arun(
            ["sh", "-c", "cat; echo $FOO; exit 3"], stdin="in\n", env={"FOO": "bar"}
        )
        assert (result.stdout, result.exit_code, result.stop_reason) == ("in\nbar\n", 3, "ok")
        missing = await session.arun(["no-such-program"])
        assert (missing.exit_code, "no-such-program" in missing.stderr) == (127, True)
        await session.arun("echo echo > not-executable")
        refused = await session.arun(["./not-executable"])
        assert (refused.exit_code, "Permission denied" in refused.stderr) == (126, True)
        nul = await session.arun(["echo", "a\0b"], env={"A": "1"})
        assert (nul.exit_code, nul.stop_reason, "NUL byte" in nul.stderr) == (126, "ok", True)
        killed = await session.arun("kill -TERM $$")
        assert (killed.exit_code, killed.stop_reason) == (143, "killed")
        env = await session.arun("env | sort")
        assert "ENVHUB" not in env.stdout and "HOME=/sandbox\n" in env.stdout


@pytest.mark.parametrize(
    ("plant", "trigger", "expected"),
    [
        # A setuid copy of a shell: no_new_privs and nosuid keep it the session's uid.
        ("cp /bin/sh ./rootsh && chmod 4755 rootsh", "./rootsh -c 'id -u'", "{uid}\n"),
        # A symlink to a host file: read inside the sandbox, where the host file is not.
        ("ln -s {canary} link", "cat link 2>&1 | grep -c secret; true", "0\n"),
        # A FIFO with a reader left behind: a later call writes to it without blocking for ever.
        (
            "mkfifo p && (cat p > got &) && echo planted",
            "echo through > p; sleep 0.2; cat got",
            "through\n",
        ),
        # A background process that keeps killing the init and a host pid: neither dies.
        (
            "(while true; do kill -9 1 {host}; sleep 0.05; done) >/dev/null 2>&1 & echo planted",
            "sleep 0.3; echo alive",
            "alive\n",
        ),
    ],
    ids=["setuid", "symlink", "fifo", "killer"],
)
@in_a_loop
async def test_plant_in_one_call_trigger_in_the_next(
    box: LocalSandbox, tmp_path: Path, plant: str, trigger: str, expected: str
) -> None:
    canary = tmp_path / "canary"
    canary.write_text("secret")
    host = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        async with box.session() as session:
            fill = {"canary": canary, "host": host.pid, "uid": session.uid}
            await session.arun(plant.format(**fill))
            result = await session.arun(trigger.format(**fill))
            assert result.stdout == expected.format(uid=session.uid)
            assert host.poll() is None
    finally:
        host.kill()
        host.wait()
    assert canary.read_text() == "secret"


@in_a_loop
async def test_file_helpers_do_not_follow_links_to_the_host(
    box: LocalSandbox, tmp_path: Path
) -> None:
    canary = tmp_path / "canary"
    canary.write_text("secret")
    async with box.session() as session:
        await session.arun(f"ln -s {canary} link && ln -s /etc/passwd pw")
        with pytest.raises(FileNotFoundError):
            await session.read_file("link")
        with pytest.raises(SandboxError):
            await session.write_file("pw", "x")  # /etc inside is read-only
        with pytest.raises(SandboxError):
            await session.write_file("link", "overwritten")
    assert canary.read_text() == "secret" and list(tmp_path.iterdir()) == [canary]


CONTAINED = {
    "fork bomb": (FORK_COUNT, "14 11\n"),
    "no network": (
        "import socket\n"
        "try:\n"
        "    socket.create_connection(('192.0.2.1', 80), timeout=2)\n"
        "except OSError as e:\n"
        "    print(e.errno)",
        "101\n",
    ),
    "no secrets or host files": (
        "import os\n"
        f"for p in ('/etc/shadow', '/root', {str(REPO / 'pyproject.toml')!r}):\n"
        "    print(os.path.exists(p))\n"
        "print(sorted(k for k in os.environ if 'SECRET' in k))",
        "False\nFalse\nFalse\n[]\n",
    ),
    "no host writes": (
        "for p in ('/usr/evil', '/etc/x', '/evil'):\n"
        "    try:\n"
        "        open(p, 'w')\n"
        "    except OSError as e:\n"
        "        print(e.errno)",
        "30\n30\n30\n",
    ),
    "no nested namespaces": (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.unshare(0x10000000), ctypes.get_errno())",
        "-1 28\n",
    ),
    "disk full": (
        "try:\n"
        "    with open('big', 'wb') as f:\n"
        "        while True:\n"
        "            f.write(b'x' * 65536)\n"
        "except OSError as e:\n"
        "    print(e.errno)",
        "27\n",  # the file size limit (16 MiB) comes first
    ),
    "pid namespace": (
        "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit())[:2])",
        "[1, 2]\n",
    ),
}


@pytest.mark.parametrize("attack", list(CONTAINED))
@in_a_loop
async def test_one_shot_containment_holds_in_a_session(
    box: LocalSandbox, attack: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ENVHUB_TEST_SECRET", "hunter2")
    code, expected = CONTAINED[attack]
    async with box.session() as session:
        result = await session.arun(python(code))
        assert (result.stdout, result.stop_reason) == (expected, "ok")
        assert (await session.arun("echo next")).stdout == "next\n"


@in_a_loop
async def test_network_only_when_asked(box: LocalSandbox) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        code = (
            "import socket\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "    print('connected')\n"
            "except OSError as e:\n"
            "    print(e.errno)"
        )
        async with box.session() as closed, box.session(limits=LIMITS.with_(network=True)) as open_:
            assert (await closed.arun(python(code))).stdout == "111\n"  # its own loopback
            assert (await open_.arun(python(code))).stdout == "connected\n"


@in_a_loop
async def test_disk_limit_spans_the_session(box: LocalSandbox) -> None:
    limits = LIMITS.with_(disk_mb=8, file_size_mb=64)
    async with box.session(limits=limits) as session:
        first = await session.arun("head -c 5000000 /dev/zero > a && echo ok")
        second = await session.arun("head -c 5000000 /dev/zero > /tmp/b; echo $?")
        assert (first.stdout, second.stdout) == ("ok\n", "1\n")
        assert "No space left on device" in second.stderr


@in_a_loop
async def test_sessions_run_side_by_side(box: LocalSandbox, workspace: Workspace) -> None:
    sessions = [box.session(workspace) for _ in range(4)]
    try:
        writes = [
            s.arun(f"echo {i} > mine && sleep 0.2 && cat mine") for i, s in enumerate(sessions)
        ]
        results = await asyncio.gather(*writes)
        assert [r.stdout for r in results] == ["0\n", "1\n", "2\n", "3\n"]
        assert len({s.uid for s in sessions}) == 4
    finally:
        await asyncio.gather(*[s.aclose() for s in sessions])


def test_the_sync_twins(box: LocalSandbox) -> None:
    with box.session() as session:
        assert session.run("echo hi").stdout == "hi\n"
        session.run("sleep 300 &")
        assert isinstance(session, LocalSession) and len(session.processes()) == 1
        session.kill_processes()
        assert session.processes() == []


def test_killing_the_caller_leaves_nothing(tmp_path: Path) -> None:
    script = tmp_path / "caller.py"
    script.write_text(
        "import asyncio, os\n"
        "from envhub.sandbox import LocalSandbox, Workspace, session_launcher\n"
        "box = LocalSandbox(base_uid=61480, max_concurrency=2)\n"  # uids no other test uses
        "workspace = Workspace.from_files({'f': 'x'})\n"
        "async def main():\n"
        "    session = box.session(workspace)\n"
        "    await session.arun('setsid sleep 300 & echo written > f')\n"
        "    space = os.readlink(f'/proc/{session._running.bwrap}/ns/mnt')\n"
        "    helper = session_launcher.launcher().proc.pid\n"
        "    print(session.uid, *session.processes(), workspace.path, space, helper, flush=True)\n"
        "    os.kill(os.getpid(), 9)\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    uid, sleeper, folder, space, launcher = done.stdout.split()
    assert (done.returncode, _uid_of(int(sleeper))) in ((-signal.SIGKILL, int(uid)), (-9, None))
    deadline = time.monotonic() + 10
    while (live_sandbox_processes([int(uid)]) or _alive(int(launcher))) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert live_sandbox_processes([int(uid)]) == []
    # Its files went with its mount namespace: nothing of the session or the launcher holds it
    # (a namespace's number may be reused by anyone's new one once it is gone).
    holders = [pid for pid in _in_mount_namespace(space) if _uid_of(pid) == int(uid)]
    assert holders == [] and not _alive(int(launcher))
    assert (Path(folder) / "f").read_text() == "x"  # the workspace was never written
    Path(folder, "f").unlink()
    Path(folder).rmdir()


def _uid_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Uid:"))
    except OSError:
        return None


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (exists and is no zombie)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return not any(line.startswith("State:\tZ") for line in f)
    except OSError:
        return False


def _in_mount_namespace(space: str) -> list[int]:
    """Pids of the processes in the mount namespace ``space`` (``mnt:[inode]``)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.readlink(f"/proc/{entry.name}/ns/mnt") == space:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found
