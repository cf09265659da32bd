"""The process plumbing of the local backend, on plain host commands."""

from __future__ import annotations

import asyncio
import time

from envhub.sandbox import _process


def test_a_run_whose_pipes_outlive_it_is_waited_for_without_spinning() -> None:
    # The shell exits at once; its background sleep holds stdout open for 1.5 s more.
    argv = ["/bin/sh", "-c", "echo start; sleep 1.5 & exit 3"]
    cpu = time.process_time()
    outcome = asyncio.run(_process.execute(argv, stdin=b"", output_cap=1 << 20, deadline=10))
    assert (outcome.stdout, outcome.exit_code, outcome.killed_for) == (b"start\n", 3, None)
    assert outcome.seconds >= 1.5
    # Waiting for end-of-file costs no CPU (milliseconds); spinning would cost a core for 1.5 s,
    # still more than 0.3 s on a machine whose cores are shared with other work.
    assert time.process_time() - cpu < 0.3


def test_a_process_started_ahead_runs_later_on_another_loop() -> None:
    proc = _process.spawn(["/bin/sh", "-c", "read line; echo got $line; exit 5"])
    time.sleep(0.05)  # no loop runs while it waits for its stdin

    async def drive() -> _process.Outcome:
        return await _process.drive(proc, stdin=b"hello\n", output_cap=1 << 20, deadline=10)

    outcome = asyncio.run(drive())
    assert (outcome.stdout, outcome.stderr, outcome.exit_code) == (b"got hello\n", b"", 5)


def test_output_past_the_cap_kills_the_run() -> None:
    argv = ["/bin/sh", "-c", "while true; do echo yyyyyyyyyyyyyyyy; done"]
    outcome = asyncio.run(_process.execute(argv, stdin=b"", output_cap=1000, deadline=10))
    assert (len(outcome.stdout), outcome.exit_code, outcome.killed_for) == (
        1000,
        None,
        "output_limit",
    )
