"""The local backend does what the ``Sandbox`` interface promises: stdin, files in and out,
exit status, stop reasons, limits, concurrency; and its inputs are checked."""

from __future__ import annotations

import asyncio
import os

import pytest

from envhub.errors import ConfigError, SandboxUnavailableError
from envhub.sandbox import ExecResult, Limits, LocalSandbox, make_sandbox
from envhub.sandbox.base import classify_exit
from envhub.sandbox.outputs import frame, parse_outputs

from .conftest import live_sandbox_processes


def test_print_one(sandbox: LocalSandbox) -> None:
    result = sandbox.run_python("print(1)")
    assert (result.stdout, result.stderr, result.exit_code, result.stop_reason, result.files) == (
        "1\n",
        "",
        0,
        "ok",
        {},
    )
    assert result.ok and result.describe() == "exit 0"
    assert 0 < result.wall_time < 5


def test_stdin_files_in_and_out(sandbox: LocalSandbox) -> None:
    code = (
        "import sys\n"
        "text = sys.stdin.read()\n"
        "open('out/rev.txt', 'w').write(text[::-1])\n"
        "print(open('data/in.txt').read())"
    )
    result = sandbox.run(
        ["python3", "main.py"],
        stdin="abc",
        files={"main.py": code, "data/in.txt": "héllo", "out/.keep": ""},
        output_files=["out/rev.txt", "missing.txt", "data/in.txt"],
    )
    assert (result.stdout, result.exit_code) == ("héllo\n", 0)
    assert result.files == {"out/rev.txt": b"cba", "data/in.txt": "héllo".encode()}


def test_a_shell_command_and_its_exit_status(sandbox: LocalSandbox) -> None:
    result = sandbox.run("echo out; echo err >&2; exit 3")
    assert (result.stdout, result.stderr, result.exit_code, result.stop_reason) == (
        "out\n",
        "err\n",
        3,
        "ok",
    )
    assert not result.ok and result.describe() == "exit 3"


def test_the_sandbox_sees_a_clean_environment(sandbox: LocalSandbox) -> None:
    code = (
        "import os, socket\n"
        "print(os.getcwd(), sorted(os.listdir('.')), socket.gethostname())\n"
        "print(sorted(os.environ))"
    )
    result = sandbox.run_python(code)
    assert result.stdout.splitlines() == [
        "/sandbox ['.tmp', 'main.py'] sandbox",
        "['HOME', 'LANG', 'PATH', 'PWD', 'PYTHONDONTWRITEBYTECODE', 'TMPDIR']",
    ]


def test_each_run_starts_empty(sandbox: LocalSandbox) -> None:
    sandbox.run("echo left > here.txt; echo left > /tmp/here.txt")
    result = sandbox.run("ls -A . /tmp")
    assert result.stdout == ".:\n.tmp\n\n/tmp:\n"


def test_concurrent_runs_are_independent(sandbox: LocalSandbox) -> None:
    async def many() -> list[ExecResult]:
        return await asyncio.gather(
            *[
                sandbox.arun_python(f"import time; time.sleep(0.2); print({i} * {i})")
                for i in range(12)
            ]
        )

    results = asyncio.run(many())
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(12)]
    assert live_sandbox_processes(sandbox) == []


def test_a_cancelled_run_leaves_nothing_behind(sandbox: LocalSandbox) -> None:
    async def cancel() -> None:
        task = asyncio.ensure_future(sandbox.arun_python("import time; time.sleep(30)"))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel())
    assert live_sandbox_processes(sandbox) == []
    assert sandbox.run_python("print('next')").stdout == "next\n"


@pytest.mark.parametrize(
    ("exit_code", "stderr", "reason"),
    [
        (0, "", "ok"),
        (1, "Traceback ...\nValueError: x\n", "ok"),
        (1, "Traceback ...\nMemoryError\n", "memory"),
        (0, "MemoryError\n", "ok"),
        (152, "", "timeout"),
        (139, "", "killed"),
        (137, "", "killed"),
    ],
)
def test_classify_exit(exit_code: int, stderr: str, reason: str) -> None:
    assert classify_exit(exit_code, stderr) == reason


def test_output_framing_round_trip_and_garbage() -> None:
    files = {"a.txt": b"1\n2\n", "b/c": b""}
    assert parse_outputs(frame(files), ["a.txt", "b/c"]) == files
    assert parse_outputs(frame(files), ["a.txt"]) == {
        "a.txt": b"1\n2\n"
    }  # not asked for: stop there
    assert parse_outputs(b"a.txt\n99\nshort", ["a.txt"]) == {}
    assert parse_outputs(frame(files) + b"junk", ["a.txt", "b/c"]) == files


@pytest.mark.parametrize("path", ["/etc/passwd", "../x", "a/../../x", "", "a//b"])
def test_file_paths_must_stay_inside(sandbox: LocalSandbox, path: str) -> None:
    with pytest.raises(ConfigError, match="must be relative"):
        sandbox.run("true", files={path: "x"})


def test_limits_are_validated() -> None:
    with pytest.raises(ConfigError, match="memory_mb must be positive"):
        Limits(memory_mb=0)
    with pytest.raises(ConfigError, match="cpu_time must be positive"):
        Limits(cpu_time=-1)
    assert Limits(wall_time=2.5).cpu_seconds == 4
    assert Limits(wall_time=1).cpu_seconds == 2
    assert Limits(wall_time=9, cpu_time=0.2).cpu_seconds == 1


def test_a_missing_bwrap_is_a_clear_error() -> None:
    with pytest.raises(
        SandboxUnavailableError, match="`no-such-bwrap` is not installed; install bubblewrap"
    ):
        LocalSandbox(bwrap="no-such-bwrap")


def test_make_sandbox_by_name() -> None:
    assert isinstance(make_sandbox("local", max_concurrency=2), LocalSandbox)
    with pytest.raises(ConfigError, match="unknown sandbox backend 'docker'"):
        make_sandbox("docker")


def test_the_rlimits_fallback_limits_but_does_not_isolate() -> None:
    weak = LocalSandbox(
        Limits(wall_time=3, processes=8), isolation="rlimits", base_uid=61100, max_concurrency=2
    )
    result = weak.run(
        "cat in.txt; echo x > out.txt", files={"in.txt": "hi\n"}, output_files=["out.txt"]
    )
    assert (result.stdout, result.exit_code, result.files) == ("hi\n", 0, {"out.txt": b"x\n"})
    bomb = (
        "import os, time\n"
        "n = 0\n"
        "while True:\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(30)\n"
        "        os._exit(0)\n"
        "    n += 1\n"
        "print(n)"
    )
    result = weak.run_python(bomb)
    assert (result.stdout, result.stop_reason) == (
        "6\n",
        "ok",
    )  # 8 processes: sh, python, 6 children
    assert (
        weak.run_python("while True: pass", limits=Limits(wall_time=0.5)).stop_reason == "timeout"
    )
    assert live_sandbox_processes(weak) == []


RLIMITS = """\
import resource as r
for name in ("AS", "CPU", "FSIZE", "NOFILE", "CORE", "NPROC"):
    print(name, *r.getrlimit(getattr(r, "RLIMIT_" + name)))
"""


@pytest.mark.parametrize("way", ["ulimit-in-init", "prlimit", "warm-stub", "zygote"])
def test_every_way_of_setting_rlimits_gives_the_same_limits(way: str) -> None:
    box = LocalSandbox(
        Limits(wall_time=5, cpu_time=3, memory_mb=300, processes=12, file_size_mb=2, open_files=99),
        base_uid=61100,  # a pool of its own: the module's sandboxes keep warm ones in theirs
        max_concurrency=8,
        warm=2 if way == "warm-stub" else 0,
        zygote=way == "zygote",
    )
    if way == "prlimit" and not box.limits_in_init:
        pytest.skip("/bin/sh is not dash here: prlimit is the only way")
    if way == "zygote" and not box.zygote:
        pytest.skip("zygotes serve runs only when envhub runs as root")
    box.limits_in_init = way != "prlimit"
    mib = 1 << 20
    # prlimit also counts the outer bubblewrap, outside the sandbox: one more, same room.
    nproc = 13 if way == "prlimit" else 12
    fork_all = (
        "import os, time\nn = 0\nwhile True:\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(30)\n"
        "        os._exit(0)\n    n += 1\nprint(n)"
    )
    if way == "warm-stub":  # the first run of a kind starts cold and warms the next ones
        assert box.run_python("pass").ok and len(box.warm_uids) == 2
    assert box.run_python(RLIMITS).stdout == (
        f"AS {300 * mib} {300 * mib}\nCPU 3 4\nFSIZE {2 * mib} {2 * mib}\nNOFILE 99 99\n"
        f"CORE 0 0\nNPROC {nproc} {nproc}\n"
    )
    assert box.warm_runs == (1 if way == "warm-stub" else 0)
    assert box.zygote_runs == (1 if way == "zygote" else 0)
    # Any way 12 processes for the run: the sandbox's sh init, python and 10 children (a
    # zygote's run sets its own limits inside the sandbox, as the init does).
    result = box.run_python(fork_all)
    assert (result.stdout, result.stop_reason) == ("10\n", "ok")
    # A write past 2 MiB: SIGXFSZ (128 + 25) with exactly 2 MiB written.
    big = box.run_python("with open('f', 'wb') as f:\n    f.write(bytes(3000000))")
    # (Python ignores SIGXFSZ: the write fails instead.)
    assert big.exit_code == 1 and big.stderr.endswith("OSError: [Errno 27] File too large\n")
    shell = box.run("head -c 3000000 /dev/zero > f; echo $?; wc -c < f")
    assert (shell.stdout, shell.stderr) == ("153\n2097152\n", "File size limit exceeded\n")
    assert live_sandbox_processes(box) == []
    box.close()
    assert box.warm_uids == frozenset() and live_sandbox_processes(box) == []


def test_a_limit_the_init_cannot_set_stops_the_run() -> None:
    box = LocalSandbox(Limits(wall_time=5), base_uid=61000, max_concurrency=8)
    if not box.limits_in_init:
        pytest.skip("/bin/sh is not dash here")
    # More open files than the kernel allows a process (fs.nr_open): ulimit refuses it.
    result = box.run("echo ran", limits=Limits(wall_time=5, open_files=1 << 30))
    assert (result.stdout, result.exit_code) == ("", 125)
    assert "envhub sandbox: cannot set its limits" in result.stderr


def test_a_uid_whose_sandbox_init_is_gone_is_free_without_searching_proc(
    sandbox: LocalSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    searched: list[int] = []

    async def search(uid: int, timeout: float = 10.0) -> None:
        searched.append(uid)

    monkeypatch.setattr("envhub.sandbox._process.wait_uid_gone", search)
    assert sandbox.run("echo hi").stdout == "hi\n"
    assert searched == []  # bubblewrap named the init; it has gone, and its namespace with it
    if not sandbox.as_root:
        return
    # No init known (bubblewrap never started one), or one still alive: /proc is searched.
    alive = os.getpid()
    for init in (None, alive):
        uid = asyncio.run(sandbox.uids.acquire())
        asyncio.run(sandbox._release(uid, init))
        assert searched[-1] == uid
    assert len(searched) == 2
