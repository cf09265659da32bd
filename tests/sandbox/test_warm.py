"""Warm sandboxes: a Python run in a sandbox started ahead gives exactly what a cold start
gives, is one call's alone, and never keeps a uid from a call that needs it."""

from __future__ import annotations

import asyncio
import gc
import os
import signal

import pytest

from envhub.sandbox import Limits, LocalSandbox
from envhub.sandbox.warm import script_of

from .conftest import live_sandbox_processes, requires_bwrap

pytestmark = requires_bwrap

BASE = 61200
"""Uids of this module's sandboxes: pools of their own (other modules' sandboxes keep warm
ones in theirs)."""

PROGRAMS = {
    "argv and module": (
        "import os, stat, sys\n"
        "print(sys.argv, sys.orig_argv, __file__, __name__, sys.path[:2], os.getpid())\n"
        "print(sorted(k for k in globals() if k.startswith('__')), type(__loader__).__name__)\n"
        "print(oct(stat.S_IMODE(os.stat('main.py').st_mode)), os.getcwd(), sorted(os.listdir()))\n"
        "print(oct(os.stat('data').st_mode), open('data/x.txt').read())\n"
    ),
    "exit status": "import sys; print('x'); sys.exit(3)",
    "exit message": "import sys; sys.exit('bye')",
    "os._exit": "import os; print('a', flush=True); os._exit(4)",
    "stdin": "import sys; data = sys.stdin.read(); print(len(data), data[:5])",
    "syntax error": "def f(:\n  pass\n",
    "traceback": "def f():\n    raise ValueError('boom')\nf()\n",
    "chained": "try:\n  1/0\nexcept Exception as e:\n  raise ValueError('x') from e\n",
    "KeyboardInterrupt": (
        "import atexit; atexit.register(lambda: print('atexit')); raise KeyboardInterrupt"
    ),
    "excepthook": "import sys\nsys.excepthook = lambda t, v, tb: print('hooked', t.__name__)\n1/0",
    "pickle": (
        "import pickle\nclass A: pass\nprint(type(pickle.loads(pickle.dumps(A()))).__module__)"
    ),
    "getsource": "import inspect\ndef g(): return 1\nprint(inspect.getsource(g))",
    "warning": "import warnings; warnings.warn('careful')",
    "annotations": (
        "print(__doc__, __spec__, __package__, __cached__)\nx: int = 3\nprint(__annotations__)"
    ),
    "coding": "# -*- coding: latin-1 -*-\nprint('ok')\n",
    "unflushed file": "import os\nout = open(1, 'w', closefd=False)\nout.write('via fd 1\\n')\n",
    "__del__ at exit": (
        "class A:\n    def __del__(self):\n        print('del', flush=True)\na = A()\n"
        "class B:\n    def __del__(self):\n        print('cycle', flush=True)\n"
        "b = B()\nb.me = b\ndel b\n"
    ),
    "threads and atexit": (
        "import atexit, threading, time\natexit.register(print, 'bye')\n"
        "def late():\n    time.sleep(0.1)\n    print('thread')\n"
        "threading.Thread(target=late).start()\nthreading.Thread(target=time.sleep, args=(9,),"
        " daemon=True).start()\nprint('main')\n"
    ),
    "closed stdout": "import sys\nprint('x')\nsys.stdout.close()\n",
    "stdout fd closed": "import os\nprint('lost')\nos.close(1)\n",
    "child process": (
        "import subprocess, sys\n"
        "print(subprocess.run([sys.executable, '-c', 'print(7)'], capture_output=True).stdout)"
    ),
}


def _outcome(result: object) -> tuple:
    return (result.stdout, result.stderr, result.exit_code, result.stop_reason)  # type: ignore[attr-defined]


@pytest.mark.parametrize("zygote", [False, True], ids=["stub", "zygote"])
@pytest.mark.parametrize("flags", [["-I"], ["-I", "-S"]], ids=["-I", "-I -S"])
def test_a_warm_run_gives_exactly_what_a_cold_run_gives(flags: list[str], zygote: bool) -> None:
    cold = LocalSandbox(warm=0, base_uid=BASE, zygote=False)
    warm = LocalSandbox(warm=2, base_uid=BASE, zygote=zygote)
    if zygote and not warm.zygote:
        pytest.skip("zygotes serve runs only when envhub runs as root")

    async def compare() -> None:
        for name, code in PROGRAMS.items():
            argv = ["python3", *flags, "main.py", "arg 1"]
            call = {"stdin": "hello world", "files": {"main.py": code, "data/x.txt": "X"}}
            expected = _outcome(await cold.arun(argv, **call))
            taken = warm.warm_runs
            got = _outcome(await warm.arun(argv, **call))
            assert got == expected, name
            if warm.warm_runs == taken:  # the first of its kind ran cold: again, warm
                assert _outcome(await warm.arun(argv, **call)) == expected, name
                assert warm.warm_runs == taken + 1

    asyncio.run(compare())
    assert warm.warm_runs >= len(PROGRAMS) - 1
    # A zygote forks every run of a kind, the first too (into a sandbox started for it).
    assert warm.zygote_runs == (warm.warm_runs + 1 if zygote else 0)
    warm.close()
    cold.close()


def test_a_warm_run_finds_nothing_of_the_one_before() -> None:
    box = LocalSandbox(warm=2, base_uid=BASE)
    leave = (
        "import subprocess\n"
        "open('mine', 'w').write('x'); open('/tmp/mine', 'w').write('x')\n"
        "subprocess.Popen(['sleep', '30'])\n"
    )
    look = (
        "import os\n"
        "print(sorted(os.listdir('.')), os.listdir('/tmp'), sorted(os.listdir('/proc'))[:3])"
    )
    for _ in range(3):
        box.run_python(leave)
        seen = box.run_python(look)
        assert seen.stdout == "['.tmp', 'main.py'] [] ['1', '2', 'acpi']\n", seen
    assert box.warm_runs >= 4
    assert live_sandbox_processes(box) == []
    box.close()


def test_a_call_that_needs_a_uid_stops_a_warm_sandbox_for_it() -> None:
    box = LocalSandbox(max_concurrency=2, warm=2, base_uid=BASE)
    assert box.run_python("pass").ok
    assert len(box.warm_uids) == 1  # the one uid the first run did not hold

    async def two_at_once() -> list[str]:
        runs = [box.arun("sleep 0.2; echo $((1+1))") for _ in range(2)]
        return [r.stdout for r in await asyncio.wait_for(asyncio.gather(*runs), 30)]

    assert asyncio.run(two_at_once()) == ["2\n", "2\n"]
    assert box.warm_uids == frozenset()
    box.close()


def test_warm_sandboxes_stop_when_the_sandbox_is_closed_or_collected() -> None:
    box = LocalSandbox(warm=2, base_uid=BASE)
    box.run_python("pass")
    uids = sorted(box.warm_uids)
    assert len(uids) == 2 and live_sandbox_processes(uids) != []
    box.close()
    assert live_sandbox_processes(uids) == []
    box.run_python("pass")  # a closed sandbox still runs calls, and warms again
    uids = sorted(box.warm_uids)
    assert len(uids) == 2
    del box
    gc.collect()
    assert live_sandbox_processes(uids) == []


def test_a_warm_sandbox_killed_while_waiting_is_passed_over() -> None:
    box = LocalSandbox(warm=2, base_uid=BASE)
    box.run_python("pass")
    for boxes in box._warm.boxes.values():
        for waiting in boxes:
            os.kill(waiting.proc.pid, signal.SIGKILL)
            waiting.proc.wait()
    result = box.run_python("print(6 * 7)")
    assert (result.stdout, result.exit_code) == ("42\n", 0)
    assert live_sandbox_processes(box) == []
    box.close()


def test_each_warm_call_gets_its_own_limits() -> None:
    box = LocalSandbox(Limits(wall_time=5), warm=2, base_uid=BASE)
    box.run_python("pass")
    small = box.run_python("a = bytearray(300 << 20)", limits=Limits(wall_time=5, memory_mb=200))
    assert (small.exit_code, small.stop_reason) == (1, "memory")
    fine = box.run_python("a = bytearray(300 << 20); print(len(a) >> 20)")
    assert fine.stdout == "300\n"
    slow = box.run_python("while True:\n    pass", limits=Limits(wall_time=1))
    assert (slow.exit_code, slow.stop_reason) == (None, "timeout")
    assert box.warm_runs == 3
    box.close()


def test_only_python_scripts_of_the_call_run_warm() -> None:
    files = {"main.py": b"", "x.txt": b""}
    assert script_of(["python3", "-I", "main.py", "a"], "python3", files) == 2
    assert script_of(["python3", "-I", "-S", "main.py"], "python3", files) == 3
    assert script_of(["python3", "main.py"], "python3", files) == 1
    assert script_of(["python3", "-c", "print(1)"], "python3", files) is None  # not a flag we know
    assert script_of(["python3", "-X", "dev", "main.py"], "python3", files) is None
    assert script_of(["python3", "-I", "other.py"], "python3", files) is None  # not a call file
    assert script_of(["python3", "-I", "x.txt"], "python3", files) is None
    assert script_of(["/usr/bin/python3", "main.py"], "python3", files) is None
    assert script_of(["sh", "-c", "python3 main.py"], "python3", files) is None


def test_a_forked_child_leaves_its_parents_warm_sandboxes_and_uids_alone() -> None:
    box = LocalSandbox(warm=2, base_uid=BASE)
    box.run_python("pass")
    parent_uids, warm_pids = (
        set(box.uids.uids),
        [w.proc.pid for b in box._warm.boxes.values() for w in b],
    )
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it ran and with which uids, then leave at once
        try:
            result = box.run_python("import os; print(os.getuid())")
            report = f"{result.stdout.strip()} {int(bool(set(box.uids.uids) & parent_uids))}"
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            report = repr(e)
        os.write(write, report.encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as f:
        uid, shared = f.read().split()
    assert int(uid) not in parent_uids and shared == "0"
    assert all(os.path.exists(f"/proc/{p}") for p in warm_pids)  # still waiting, untouched
    assert box.run_python("print(1)").stdout == "1\n" and box.warm_runs == 1
    box.close()


def test_calls_start_cold_once_runs_queue_for_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    box = LocalSandbox(warm=2, base_uid=BASE, zygote=False)
    box.run_python("pass")  # cold; warms two

    async def three_at_once() -> list[str]:
        runs = [box.arun_python(f"print({i})") for i in range(3)]
        return [r.stdout for r in await asyncio.gather(*runs)]

    # On 2 cores only a call that finds no other run in flight takes a warm sandbox.
    assert asyncio.run(three_at_once()) == ["0\n", "1\n", "2\n"]
    assert box.warm_runs == 1
    assert box.run_python("print(3)").stdout == "3\n" and box.warm_runs == 2
    box.close()


@pytest.mark.parametrize("zygote", [False, True], ids=["stub", "zygote"])
def test_at_most_four_kinds_of_run_are_kept_warm(zygote: bool) -> None:
    box = LocalSandbox(warm=1, base_uid=BASE, zygote=zygote)
    kinds = [["-I"], ["-I", "-S"], ["-S"], ["-B"], ["-E"]]
    for flags in kinds:
        result = box.run(["python3", *flags, "main.py"], files={"main.py": "print(1)"})
        assert result.stdout == "1\n"
    warm_kinds = {kind[0] for kind, boxes in box._warm.boxes.items() if boxes}
    assert warm_kinds == {tuple(flags) for flags in kinds[:4]}
    assert len(box.warm_uids) == 4
    assert sorted(box._zygotes) == (sorted(tuple(f) for f in kinds[:4]) if box.zygote else [])
    box.close()
