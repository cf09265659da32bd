"""The sweep ends what an earlier, dead owner of the same folder left, and nothing else."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envhub.lifetime import LISTING, OWNER_DIR_ENV, OWNER_ENV, REAPER, owning, sweep
from envhub.lifetime.procs import alive, command_line, owner_tag, pids

HANG_S = 60.0


def dead_owner_tag() -> str:
    """The tag of a process that has exited."""
    process = subprocess.Popen(["true"])
    tag = owner_tag(process.pid)
    process.wait()
    return tag


def tagged_sleeper(folder: Path, owner: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, OWNER_DIR_ENV: str(folder.resolve()), OWNER_ENV: owner}
    return subprocess.Popen(["sleep", "300"], env=env)


def test_a_process_of_a_dead_owner_is_ended_and_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    owner = dead_owner_tag()
    assert not alive(owner)
    left = tagged_sleeper(tmp_path, owner)
    live = tagged_sleeper(tmp_path, owner_tag(os.getpid()))  # a live owner's: not a leftover
    other = tagged_sleeper(tmp_path / "elsewhere", owner)  # another folder's
    try:
        with caplog.at_level(logging.WARNING, logger="envhub.lifetime"):
            ended = sweep(tmp_path)
        assert [(e.pid, e.name, e.owner) for e in ended] == [(left.pid, "sleep 300", owner)]
        assert left.wait(HANG_S) == -15
        assert f"ending sleep 300 left by an earlier run of {tmp_path}" in caplog.text
        assert live.poll() is None and other.poll() is None
    finally:
        for process in (left, live, other):
            process.kill()
            process.wait()


def test_owning_tags_what_starts_inside_and_restores_the_environment(tmp_path: Path) -> None:
    before = {name: os.environ.get(name) for name in (OWNER_DIR_ENV, OWNER_ENV)}
    with owning(tmp_path) as ended:
        assert ended == []
        child = subprocess.run(
            ["sh", "-c", f'echo "${OWNER_DIR_ENV}|${OWNER_ENV}"'],
            capture_output=True,
            text=True,
            check=True,
        )
    assert child.stdout.strip() == f"{tmp_path.resolve()}|{owner_tag(os.getpid())}"
    assert {name: os.environ.get(name) for name in before} == before


# Enters owning(FOLDER), starts a process in a session of its own (out of reach of any process
# group signal), prints its pid, then sleeps until it is killed.
OWNER = """
import subprocess, sys, time
from envhub.lifetime import owning
with owning(sys.argv[1]):
    escaped = subprocess.Popen(["sleep", "300"], start_new_session=True)
    print(escaped.pid, flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize("kill", [signal.SIGKILL, signal.SIGTERM])
def test_when_the_owner_dies_every_process_it_tagged_ends(
    tmp_path: Path, kill: signal.Signals
) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout is not None
        escaped = int(owner.stdout.readline())
        tag = owner_tag(escaped)
        assert alive(tag)
        owner.send_signal(kill)
        owner.wait(HANG_S)
        deadline = time.monotonic() + HANG_S
        while alive(tag) and time.monotonic() < deadline:
            time.sleep(0.1)
        reapers = [pid for pid in pids() if str(REAPER) in command_line(pid, width=10_000)]
        assert not alive(tag), f"left: {command_line(escaped)}; reapers running: {reapers}"
    finally:
        owner.kill()


def test_an_owner_that_ends_well_stops_its_reaper_and_leaves_other_processes_alone(
    tmp_path: Path,
) -> None:
    with owning(tmp_path):
        kept = subprocess.Popen(["sleep", "300"])  # tagged, but the owner (this test) lives on
    try:
        reapers = [
            pid for pid in pids() if str(REAPER) in command_line(pid, width=10_000)
            and f" {os.getpid()} " in command_line(pid, width=10_000) + " "
        ]  # fmt: skip
        assert reapers == []
        assert kept.poll() is None
    finally:
        kept.kill()
        kept.wait()


def test_what_a_killed_reaper_listed_is_ended_even_without_a_tag(tmp_path: Path) -> None:
    # Processes that set their title (Ray's, vLLM's) may blank their environment: the
    # reaper's list in the run folder is how the next run still finds them.
    untagged = subprocess.Popen(["sleep", "300"])
    kept = subprocess.Popen(["sleep", "300"])
    listing = tmp_path / LISTING
    try:
        row = [untagged.pid, owner_tag(untagged.pid).partition(":")[2], "sleep 300"]
        listing.write_text(json.dumps({"owner": owner_tag(os.getpid()), "processes": [row]}))
        assert sweep(tmp_path) == []  # the owner (this test) is alive: nothing is a leftover
        assert listing.exists()  # and its list stays its own
        listing.write_text(json.dumps({"owner": dead_owner_tag(), "processes": [row]}))
        ended = sweep(tmp_path)
        assert [(e.pid, e.name) for e in ended] == [(untagged.pid, "sleep 300")]
        assert untagged.wait(HANG_S) == -signal.SIGTERM
        assert kept.poll() is None
        assert not listing.exists()
    finally:
        for process in (untagged, kept):
            process.kill()
            process.wait()


def test_a_reaper_keeps_the_list_of_its_owners_processes_while_it_runs(tmp_path: Path) -> None:
    with owning(tmp_path):
        child = subprocess.Popen(["sleep", "300"])
        try:
            listing = tmp_path / LISTING
            deadline = time.monotonic() + HANG_S
            while time.monotonic() < deadline:
                listed = json.loads(listing.read_text()) if listing.exists() else {}
                if child.pid in [row[0] for row in listed.get("processes", [])]:
                    break
                time.sleep(0.1)
            assert listed["owner"] == owner_tag(os.getpid())
            noted = [row[:2] for row in listed["processes"]]  # the command may be pre-exec
            assert [child.pid, owner_tag(child.pid).partition(":")[2]] in noted
        finally:
            child.kill()
            child.wait()
    assert not listing.exists()  # the run ended well: nothing for the next one to sweep


# Under owning(FOLDER), a child (as Megatron's trainer rank 0 is) writes the weights file it
# shares with the engines, named with its own pid, closes it, prints its pid and sleeps.
WRITER = """
import subprocess, sys, time
from envhub.lifetime import owning
code = (
    "import os, sys, time; "
    "open(f'/dev/shm/envhub-weights-{os.getpid()}-test.bin', 'wb').write(b'w'); "
    "print(os.getpid(), flush=True); time.sleep(300)"
)
with owning(sys.argv[1]):
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    print(child.stdout.readline().strip(), flush=True)
    time.sleep(600)
"""


def test_the_weights_file_a_process_of_the_run_wrote_goes_with_it(tmp_path: Path) -> None:
    # What the kill harness found with Megatron: rank 0's envhub-weights file stayed in /dev/shm.
    owner = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout is not None
        writer = int(owner.stdout.readline())
        weights = Path(f"/dev/shm/envhub-weights-{writer}-test.bin")
        assert weights.exists()
        owner.kill()
        owner.wait(HANG_S)
        deadline = time.monotonic() + HANG_S
        while weights.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not weights.exists() and not alive(owner_tag(writer))
    finally:
        owner.kill()
        Path(f"/dev/shm/envhub-weights-{writer}-test.bin").unlink(missing_ok=True)
