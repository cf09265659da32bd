"""Bad programs are contained by the local sandbox. Each test asserts the exact outcome, that
the host is unchanged, and that the next run works (``after`` fixture)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from envhub.sandbox import Limits, LocalSandbox

from .conftest import live_sandbox_processes

REPO = Path(__file__).resolve().parents[2]

FORK_COUNT = """\
import os, time
n = 0
while True:
    try:
        pid = os.fork()
    except OSError as e:
        print(n, e.errno)
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    n += 1
"""


@pytest.fixture
def after(sandbox: LocalSandbox) -> Iterator[None]:
    """After the test: no sandbox process lives on, and a plain run still works."""
    yield
    assert live_sandbox_processes(sandbox) == []
    result = sandbox.run_python("print('next')")
    assert (result.stdout, result.stop_reason) == ("next\n", "ok")


def test_fork_bomb_hits_the_process_limit(sandbox: LocalSandbox, after: None) -> None:
    # 16 processes in the sandbox: its sh init, python, 14 children.
    result = sandbox.run_python(FORK_COUNT)
    assert (result.stdout, result.exit_code, result.stop_reason) == ("14 11\n", 0, "ok")


def test_a_run_cannot_raise_its_limits(sandbox: LocalSandbox, after: None) -> None:
    raise_each = (
        "import resource as r\n"
        "for name in ('AS', 'CPU', 'FSIZE', 'NPROC', 'NOFILE', 'CORE'):\n"
        "    kind = getattr(r, 'RLIMIT_' + name)\n"
        "    soft, hard = r.getrlimit(kind)\n"
        "    try:\n"
        "        r.setrlimit(kind, (hard, hard + 1))\n"
        "        print(name, 'raised')\n"
        "    except (ValueError, OSError) as e:\n"
        "        print(name, type(e).__name__)\n"
    )
    for _ in range(2):  # a cold run, then (the warm fixture) a warm one
        result = sandbox.run_python(raise_each)
        assert result.stdout.split("\n")[:-1] == [
            f"{name} ValueError" for name in ("AS", "CPU", "FSIZE", "NPROC", "NOFILE", "CORE")
        ]


def test_unbounded_fork_bomb(sandbox: LocalSandbox, after: None) -> None:
    result = sandbox.run_python("import os\nwhile True:\n    os.fork()")
    assert (result.exit_code, result.stop_reason) == (1, "ok")
    # Children that also hit the limit print their own tracebacks, interleaved and cut off when
    # the sandbox ends, so the parent's error is somewhere in stderr, not necessarily last.
    assert "\nBlockingIOError: [Errno 11] Resource temporarily unavailable\n" in result.stderr


def test_memory_bomb(sandbox: LocalSandbox, after: None) -> None:
    result = sandbox.run_python(
        "a = []\nwhile True:\n    a.append(b' ' * 10**6)",
        limits=sandbox.limits.with_(memory_mb=256),
    )
    assert (result.exit_code, result.stop_reason) == (1, "memory")
    assert result.stderr.endswith("MemoryError\n")


def test_infinite_loop_hits_the_wall_clock(sandbox: LocalSandbox, after: None) -> None:
    result = sandbox.run_python("while True:\n    pass", limits=sandbox.limits.with_(wall_time=1))
    assert (result.stdout, result.exit_code, result.stop_reason) == ("", None, "timeout")
    assert result.describe().startswith("timeout after 1.")


def test_sleeping_loop_hits_the_wall_clock(sandbox: LocalSandbox, after: None) -> None:
    result = sandbox.run_python(
        "import time\nwhile True:\n    time.sleep(1)", limits=sandbox.limits.with_(wall_time=1)
    )
    assert (result.exit_code, result.stop_reason) == (None, "timeout")


def test_busy_loop_hits_the_cpu_limit(sandbox: LocalSandbox, after: None) -> None:
    result = sandbox.run_python(
        "while True:\n    pass", limits=sandbox.limits.with_(wall_time=10, cpu_time=1)
    )
    assert (result.exit_code, result.stop_reason) == (128 + signal.SIGXCPU, "timeout")


def test_huge_stdout_is_cut_at_the_limit(sandbox: LocalSandbox, after: None) -> None:
    result = sandbox.run_python(
        "while True:\n    print('x' * 999)", limits=sandbox.limits.with_(output_bytes=10_000)
    )
    assert (result.stdout, result.exit_code, result.stop_reason) == (
        ("x" * 999 + "\n") * 10,
        None,
        "output_limit",
    )


def test_disk_fill_stops_at_the_scratch_size(sandbox: LocalSandbox, after: None) -> None:
    code = (
        "import os\n"
        "try:\n"
        "    with open('/tmp/big', 'wb') as f:\n"
        "        while True:\n"
        "            f.write(b'x' * 65536)\n"
        "except OSError as e:\n"
        "    print(e.errno, os.path.getsize('/tmp/big') <= 8 << 20)"
    )
    result = sandbox.run_python(code, limits=sandbox.limits.with_(disk_mb=8, file_size_mb=64))
    assert (result.stdout, result.stop_reason) == ("28 True\n", "ok")  # ENOSPC
    result = sandbox.run_python(code, limits=sandbox.limits.with_(disk_mb=64, file_size_mb=1))
    assert (result.stdout, result.stop_reason) == ("27 True\n", "ok")  # EFBIG


def test_writing_outside_the_sandbox_fails(
    sandbox: LocalSandbox, after: None, tmp_path: Path
) -> None:
    targets = [
        "/usr/evil",
        "/etc/passwd",
        "/evil",
        str(tmp_path / "evil"),
        str(REPO / "evil"),
        "/proc/sys/kernel/hostname",
    ]
    code = (
        f"for p in {targets!r}:\n"
        "    try:\n"
        "        open(p, 'w').write('x')\n"
        "        print('wrote', p)\n"
        "    except OSError as e:\n"
        "        print(e.errno)"
    )
    result = sandbox.run_python(code)
    assert result.stdout.split() == [
        "30",
        "30",
        "30",
        "2",
        "2",
        "13",
    ]  # EROFS x3, ENOENT x2, EACCES
    assert list(tmp_path.iterdir()) == [] and not (REPO / "evil").exists()


def test_host_files_and_secrets_are_invisible(
    sandbox: LocalSandbox, after: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ENVHUB_TEST_SECRET", "hunter2")
    (tmp_path / "canary.txt").write_text("secret")
    paths = [
        "/etc/shadow",
        "/etc/passwd",
        "/root",
        str(REPO / "pyproject.toml"),
        str(tmp_path / "canary.txt"),
    ]
    code = (
        "import os\n"
        f"for p in {paths!r}:\n"
        "    try:\n"
        "        open(p).read()\n"
        "        print('read', p)\n"
        "    except OSError as e:\n"
        "        print(e.errno)\n"
        "print('hunter2' in open('/proc/1/environ').read() + str(os.environ))\n"
        "print(sorted(p for p in os.listdir('/proc') if p.isdigit()))"
    )
    result = sandbox.run_python(code)
    assert result.stdout.splitlines() == ["2", "2", "2", "2", "2", "False", "['1', '2']"]


def test_etc_holds_only_what_programs_need_read_only(sandbox: LocalSandbox, after: None) -> None:
    listing = "import os\nprint(sorted(os.listdir('/etc')))\nopen('/etc/x', 'w')"
    result = sandbox.run_python(listing)
    wanted = ["alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime"]
    assert result.stdout == f"{[name for name in wanted if os.path.lexists('/etc/' + name)]}\n"
    assert result.stderr.endswith("OSError: [Errno 30] Read-only file system: '/etc/x'\n")
    # With network the resolver's files are bound on top, the host's own.
    hosts = sandbox.run("cat /etc/hosts", limits=Limits(wall_time=5, network=True))
    assert hosts.stdout == Path("/etc/hosts").read_text()


def test_no_network_not_even_the_hosts_loopback(sandbox: LocalSandbox, after: None) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        code = (
            "import socket\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "    print('connected')\n"
            "except OSError as e:\n"
            "    print(e.errno)\n"
            "try:\n"
            "    socket.create_connection(('192.0.2.1', 80), timeout=2)\n"
            "except OSError as e:\n"
            "    print(e.errno)"
        )
        result = sandbox.run_python(code)
        assert result.stdout.split() == ["111", "101"]  # ECONNREFUSED (own loopback), ENETUNREACH
        with pytest.raises(BlockingIOError):
            listener.accept()
        # The same program with network=True reaches the host's listener: the test can fail.
        result = sandbox.run_python(
            code.split("\ntry:\n    socket.create_connection(('192")[0],
            limits=sandbox.limits.with_(network=True),
        )
        assert result.stdout == "connected\n"


def test_killing_the_parent_and_everyone(sandbox: LocalSandbox, after: None) -> None:
    host = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        code = (
            "import os, signal\n"
            # a zygote's run has its parent outside the sandbox (getppid() 0): init stands in
            f"for pid in (os.getppid() or 1, 1, -1, {host.pid}, {os.getpid()}):\n"
            "    try:\n"
            "        os.kill(pid, signal.SIGKILL)\n"
            "        print('sent')\n"
            "    except OSError as e:\n"
            "        print(e.errno)\n"
            "print('alive')"
        )
        result = sandbox.run_python(code)
        # init ignores signals from inside its namespace; -1 finds nobody else to signal; host
        # pids do not exist in it.
        assert result.stdout.split() == ["sent", "sent", "3", "3", "3", "alive"]
        assert host.poll() is None
    finally:
        host.kill()
        host.wait()


@pytest.mark.parametrize(
    ("sig", "reason"),
    [(signal.SIGTERM, "killed"), (signal.SIGSEGV, "killed"), (signal.SIGXCPU, "timeout")],
)
def test_signals_end_the_run_with_their_number(
    sandbox: LocalSandbox, after: None, sig: int, reason: str
) -> None:
    result = sandbox.run_python(f"import os\nos.kill(os.getpid(), {int(sig)})")
    assert (result.exit_code, result.stop_reason) == (128 + sig, reason)


def test_orphans_and_zombies_die_with_the_run(sandbox: LocalSandbox, after: None) -> None:
    code = (
        "import os, time\n"
        "for _ in range(3):\n"
        "    if os.fork() == 0:\n"
        "        os.setsid()\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(60)\n"
        "        os._exit(0)\n"
        "if os.fork() == 0:\n    os._exit(0)\n"  # a zombie: never waited for
        "time.sleep(0.2)\nprint('parent done')"
    )
    started = time.monotonic()
    result = sandbox.run_python(code)
    assert (result.stdout, result.stop_reason) == ("parent done\n", "ok")
    assert time.monotonic() - started < 30  # the sleeping grandchildren did not hold the run open


def test_nested_user_namespaces_are_refused(sandbox: LocalSandbox, after: None) -> None:
    code = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.unshare(0x10000000), ctypes.get_errno())"
    )
    result = sandbox.run_python(code)
    assert result.stdout == "-1 28\n"  # ENOSPC: user.max_user_namespaces is 0 inside
    assert sandbox.run("unshare -U true").exit_code == 1


def test_killing_the_caller_kills_its_sandboxes(tmp_path: Path, after: None) -> None:
    script = tmp_path / "caller.py"
    script.write_text(
        "import asyncio, os\n"
        "from envhub.sandbox import Limits, LocalSandbox\n"
        "from envhub.sandbox._process import uid_processes\n"
        "box = LocalSandbox(base_uid=61200, max_concurrency=3)\n"
        "code = 'import os, time\\nif os.fork() == 0:\\n    os.setsid()\\ntime.sleep(60)'\n"
        "async def main():\n"
        "    runs = [asyncio.ensure_future(box.arun_python(code, limits=Limits(wall_time=60)))"
        " for _ in range(3)]\n"
        "    await asyncio.sleep(1.0)\n"
        "    uids = box.uids.uids\n"
        "    print(*uids, sum(len(uid_processes(u, live=True)) for u in uids), flush=True)\n"
        "    os.kill(os.getpid(), 9)\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    *uids, running = (int(word) for word in done.stdout.split())
    # Each run: the outer bwrap, the sandbox's init, python and its setsid child.
    assert (done.returncode, len(uids), running) == (-signal.SIGKILL, 3, 12)
    deadline = time.monotonic() + 10
    while live_sandbox_processes(uids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live_sandbox_processes(uids) == []
