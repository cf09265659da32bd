"""The guard ends its command's whole process group when an owner dies, however it dies, and
otherwise behaves as the command does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envhub.lifetime import guarded

HANG_S = 60.0  # far above the guard's own few seconds: only a hang fails here

# Starts the guarded command (a shell with a child and a grandchild), prints the guard's pid,
# then sleeps until it is killed.
OWNER = """
import subprocess, sys, time
from envhub.lifetime import guarded
command = ["sh", "-c", "sleep 300 & (sleep 300 & sleep 300) ; wait"]
guard = subprocess.Popen(guarded(command), start_new_session=True)
print(guard.pid, flush=True)
time.sleep(600)
"""


def group_gone(group: int, within: float = HANG_S) -> bool:
    """Whether no process of ``group`` is left within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def members(group: int) -> int:
    """Processes in ``group`` (zombies included)."""
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rfind(")") + 2 :].split()[2]) == group:
                count += 1
    return count


@pytest.mark.parametrize("kill", [signal.SIGKILL, signal.SIGTERM])
def test_an_owner_that_dies_takes_the_whole_group_with_it(kill: signal.Signals) -> None:
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        group = int(owner.stdout.readline())
        deadline = time.monotonic() + HANG_S
        while members(group) < 5 and time.monotonic() < deadline:  # guard, sh, sh, 3 sleeps
            time.sleep(0.05)
        assert members(group) >= 5
        owner.send_signal(kill)
        owner.wait(HANG_S)
        assert group_gone(group)
    finally:
        owner.kill()


def test_the_guard_exits_as_its_command_does() -> None:
    code = subprocess.run(guarded(["sh", "-c", "exit 3"]), start_new_session=True, timeout=HANG_S)
    assert code.returncode == 3
    killed = subprocess.run(
        guarded(["sh", "-c", "kill -TERM $$"]), start_new_session=True, timeout=HANG_S
    )
    assert killed.returncode == -signal.SIGTERM
    # SIGKILL takes no handler: the guard once crashed here (status 1 and a traceback for a
    # vLLM server the OOM killer took).
    for name in ("KILL", "SEGV"):
        done = subprocess.run(
            guarded(["sh", "-c", f"kill -{name} $$"]), start_new_session=True, timeout=HANG_S,
            capture_output=True,
        )  # fmt: skip
        assert (done.returncode, done.stderr) == (-getattr(signal, f"SIG{name}"), b"")


def test_a_command_that_exits_leaves_nothing_of_its_group_behind() -> None:
    # As vLLM's engine core outlives an API server that crashed.
    guard = subprocess.Popen(guarded(["sh", "-c", "sleep 300 & exit 3"]), start_new_session=True)
    assert guard.wait(HANG_S) == 3
    assert group_gone(guard.pid)


def test_stopping_the_guard_ends_a_command_that_ignores_sigterm_after_the_grace() -> None:
    command = ["sh", "-c", "trap '' TERM; echo up; sleep 300 & wait; wait"]
    guard = subprocess.Popen(
        guarded(command, grace=1.0), start_new_session=True, stdout=subprocess.PIPE, text=True
    )
    assert guard.stdout is not None and guard.stdout.readline() == "up\n"
    started = time.monotonic()
    guard.terminate()
    assert guard.wait(HANG_S) == -signal.SIGKILL  # the guard's last act: SIGKILL to the group
    assert time.monotonic() - started >= 1.0  # the grace was given
    assert group_gone(guard.pid)


def test_a_watched_process_that_is_already_gone_starts_nothing(tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    marker = tmp_path / "ran"
    result = subprocess.run(
        guarded(["touch", str(marker)], watch=[gone.pid]),
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert result.returncode == 1
    assert f"a watched process ([{gone.pid}]) is already gone" in result.stderr
    assert not marker.exists()


def test_the_guard_leads_a_group_of_its_own_even_when_not_started_so() -> None:
    # Without start_new_session the guard makes its own group, so ending it spares ours.
    result = subprocess.run(guarded(["sh", "-c", "ps -o pgid= -p $$"]), capture_output=True,
                            text=True, timeout=HANG_S)  # fmt: skip
    assert result.returncode == 0
    assert int(result.stdout) != os.getpgrp()


# Maps a /dev/shm file of its own and one of the test's, as vLLM's engine maps its segments
# (plain mmap: multiprocessing's resource tracker would clean up on its own).
MAPPER = """
import mmap, os, sys, time
maps = []
for name in sys.argv[1:]:
    fd = os.open(f"/dev/shm/{name}", os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, 4096)
    maps.append(mmap.mmap(fd, 4096))
print("mapped", flush=True)
time.sleep(600)
"""
GUARDED_OWNER = """
import subprocess, sys, time
from envhub.lifetime import guarded
guard = subprocess.Popen(guarded(sys.argv[1:]), start_new_session=True)
print(guard.pid, flush=True)
time.sleep(600)
"""


def test_shared_memory_the_group_left_is_released_unless_another_process_maps_it() -> None:
    import mmap

    ours, shared = f"psm_test_{os.getpid()}_ours", f"psm_test_{os.getpid()}_shared"
    fd = os.open(f"/dev/shm/{shared}", os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, 4096)
    outside = mmap.mmap(fd, 4096)  # mapped here, outside the guarded group
    command = [sys.executable, "-c", MAPPER, ours, shared]
    owner = subprocess.Popen(
        [sys.executable, "-c", GUARDED_OWNER, *command], stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout is not None
        group = int(owner.stdout.readline())
        assert owner.stdout.readline() == "mapped\n"
        owner.kill()
        owner.wait(HANG_S)
        assert group_gone(group)
        assert not Path(f"/dev/shm/{ours}").exists()  # the killed group's own: released
        assert Path(f"/dev/shm/{shared}").exists()  # mapped by this test too: kept
    finally:
        owner.kill()
        outside.close()
        os.close(fd)
        for name in (ours, shared):
            Path(f"/dev/shm/{name}").unlink(missing_ok=True)


def test_a_command_that_cannot_start_is_said_so_with_the_shells_status() -> None:
    done = subprocess.run(guarded(["/nonexistent/agent"]), capture_output=True, text=True)
    assert done.returncode == 127
    assert done.stderr == (
        "envhub guard: cannot start /nonexistent/agent: [Errno 2] No such file or directory: "
        "'/nonexistent/agent'\n"
    )


# A harness command program's episode in a process that is then SIGKILLed: what `envhub eval`
# or `envhub serve` is when a scheduler kills it (no reaper runs under them).
EPISODE = """
import asyncio, sys
from envhub.harness.programs import CommandProgram, Launch
program = CommandProgram(["sh", "-c", "sleep 300 & echo $$ > " + sys.argv[1] + "; wait"])
asyncio.run(program.run(Launch("http://127.0.0.1:9/v1", "key", {}, "task")))
"""


def test_a_harness_command_ends_with_the_process_that_runs_its_episode(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    runner = subprocess.Popen([sys.executable, "-c", EPISODE, str(pid_file)])
    deadline = time.monotonic() + HANG_S
    while not (pid_file.exists() and pid_file.read_text().strip()):
        assert time.monotonic() < deadline and runner.poll() is None
        time.sleep(0.05)
    shell = int(pid_file.read_text())
    group = os.getpgid(shell)
    assert group != os.getpgid(runner.pid)  # a group of its own: killing the runner alone
    runner.kill()  # would leave it, as it did before the guard
    runner.wait()
    assert group_gone(group)
