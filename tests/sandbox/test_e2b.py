"""The e2b backend through the real e2b SDK, against envhub's local envd on 127.0.0.1 (which
runs each command in the local bubblewrap sandbox): the same limits give the same results as
the local backend, and code rewards score identically. An opt-in test runs in e2b's cloud."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest

from envhub.errors import SandboxError, SandboxUnavailableError
from envhub.rewards.code import run_tests
from envhub.sandbox import Limits, LocalSandbox, Sandbox
from envhub.sandbox.e2b import E2BSandbox
from envhub.sandbox.session import SessionPaths

from .conftest import live_sandbox_processes
from .envd_local import LocalEnvd, local_envd_process
from .test_containment import FORK_COUNT

LIMITS = Limits(wall_time=5, processes=16)


@pytest.fixture(scope="module")
def envd(sandbox: LocalSandbox) -> Iterator[str]:
    """The local envd's URL; it runs in its own process (see ``local_envd_process``)."""
    with local_envd_process(base_uid=61500) as url:
        yield url


@pytest.fixture(scope="module")
def remote(envd: str) -> Iterator[E2BSandbox]:
    box = E2BSandbox(LIMITS, debug=True, sandbox_url=envd, http_version="1.1")
    yield box
    box.close()


def both(sandbox: LocalSandbox, remote: E2BSandbox) -> list[Sandbox]:
    return [sandbox, remote]


def test_print_one_through_the_sdk(remote: E2BSandbox) -> None:
    result = remote.run_python("print(1)")
    assert (result.stdout, result.stderr, result.exit_code, result.stop_reason, result.files) == (
        "1\n",
        "",
        0,
        "ok",
        {},
    )


def test_stdin_and_files_in_and_out(remote: E2BSandbox) -> None:
    code = (
        "import sys\n"
        "open('out.txt', 'w').write(sys.stdin.read()[::-1])\n"
        "print(open('d/in.txt').read())\n"
        "print('.stdin' in __import__('os').listdir('.'))"
    )
    result = remote.run(
        ["python3", "main.py"],
        stdin="abc",
        files={"main.py": code, "d/in.txt": "hi"},
        output_files=["out.txt", "nope"],
    )
    # The stdin file is gone before the program starts: it cannot read the harness's input.
    assert (result.stdout, result.files) == ("hi\nFalse\n", {"out.txt": b"cba"})


@pytest.mark.parametrize(
    ("code", "limits", "outcome"),
    [
        ("import sys\nprint('x')\nsys.exit(3)", None, ("x\n", 3, "ok")),
        ("while True:\n    pass", LIMITS.with_(wall_time=1), ("", None, "timeout")),
        ("while True:\n    pass", LIMITS.with_(wall_time=10, cpu_time=1), ("", 152, "timeout")),
        ("import os\nos.kill(os.getpid(), 15)", None, ("", 143, "killed")),
        (
            "a = []\nwhile True:\n    a.append(b' ' * 10**6)",
            LIMITS.with_(memory_mb=256),
            ("", 1, "memory"),
        ),
        (
            "import socket\n"
            "try:\n"
            "    socket.create_connection(('192.0.2.1', 80), timeout=2)\n"
            "except OSError as e:\n"
            "    print(e.errno)",
            None,
            ("101\n", 0, "ok"),
        ),
    ],
)
def test_same_limits_same_outcome_on_both_backends(
    sandbox: LocalSandbox, remote: E2BSandbox, code: str, limits: Limits | None, outcome: tuple
) -> None:
    for box in both(sandbox, remote):
        result = box.run_python(code, limits=limits or LIMITS)
        assert (result.stdout, result.exit_code, result.stop_reason) == outcome, box.backend
    assert live_sandbox_processes(sandbox) == []


def test_fork_bomb_is_contained_on_both_backends(sandbox: LocalSandbox, remote: E2BSandbox) -> None:
    # The same room on both: the limit counts the run's own processes (locally its init sets
    # it inside the sandbox's user namespace, so the outer bwrap is not charged).
    counts = [box.run_python(FORK_COUNT).stdout for box in both(sandbox, remote)]
    assert counts == ["14 11\n", "14 11\n"]
    assert live_sandbox_processes(sandbox) == []


def test_output_limit_on_both_backends(sandbox: LocalSandbox, remote: E2BSandbox) -> None:
    for box in both(sandbox, remote):
        result = box.run_python(
            "while True:\n    print('y' * 99)", limits=LIMITS.with_(output_bytes=1000)
        )
        assert (result.stdout, result.exit_code, result.stop_reason) == (
            ("y" * 99 + "\n") * 10,
            None,
            "output_limit",
        )


def test_code_rewards_score_identically(sandbox: LocalSandbox, remote: E2BSandbox) -> None:
    code = (
        "def f(x):\n    while x < 0:\n        pass\n    return x * 2\nprint('all tests passed')\n"
    )
    cases = [
        "assert f(2) == 4",
        {"fn": "f", "args": [3], "expected": 7},
        {"fn": "f", "args": [-1], "expected": 0},
        {"stdin": "", "stdout": "all tests passed"},
    ]
    reports = [asyncio.run(run_tests(box, code, cases, timeout=1)) for box in both(sandbox, remote)]
    assert [c.reason for c in reports[0].cases] == ["", "wrong answer: got 6", "timeout", ""]
    assert reports[0].cases == reports[1].cases


def test_concurrent_runs_through_one_vm(remote: E2BSandbox) -> None:
    async def many() -> list[str]:
        results = await asyncio.gather(*[remote.arun_python(f"print({i})") for i in range(8)])
        return [r.stdout for r in results]

    assert asyncio.run(many()) == [f"{i}\n" for i in range(8)]


def test_the_envd_serves_in_process_too(sandbox: LocalSandbox) -> None:
    with LocalEnvd(sandbox) as server:
        box = E2BSandbox(LIMITS, debug=True, sandbox_url=server.url, http_version="1.1")
        result = box.run(["cat", "in.txt"], files={"in.txt": "x"}, output_files=["in.txt"])
        assert (result.stdout, result.files) == ("x", {"in.txt": b"x"})
        assert sorted(path.rsplit("/", 1)[-1] for path in server.store) == ["in.txt"]
        box.close()


def test_e2b_sessions_show_no_other_folders() -> None:
    """Callers map such paths into the session's folder themselves (Harbor tasks do)."""
    box = E2BSandbox(debug=True, sandbox_url="http://127.0.0.1:9", http_version="1.1")
    assert box.session_path_problem("/app") == "e2b sessions show no folders but /sandbox and /tmp"
    with pytest.raises(SandboxUnavailableError, match="^cannot show /tests: e2b sessions show no"):
        box.session(paths=SessionPaths(folders=("/tests",)))
    assert box.session(paths=SessionPaths()).workspace is None


def test_an_unreachable_envd_is_a_sandbox_error() -> None:
    dead = E2BSandbox(debug=True, sandbox_url="http://127.0.0.1:9", http_version="1.1")
    with pytest.raises(SandboxError, match="^e2b: "):
        dead.run_python("print(1)")


@pytest.mark.skipif(
    not os.environ.get("E2B_API_KEY"), reason="set E2B_API_KEY to run against e2b's cloud"
)
def test_e2b_cloud() -> None:  # pragma: no cover - opt-in
    with E2BSandbox(LIMITS) as box:
        assert box.run_python("print(1)").stdout == "1\n"
        assert (
            box.run_python("while True:\n    pass", limits=LIMITS.with_(wall_time=2)).stop_reason
            == "timeout"
        )
        report = asyncio.run(
            run_tests(
                box,
                "def f(x):\n    return 2 * x\n",
                ["assert f(2) == 4", {"fn": "f", "args": [1], "expected": 3}],
            )
        )
        assert [c.passed for c in report.cases] == [True, False]
