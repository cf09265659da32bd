"""Remove a process's containers once it is gone: ``python container_reaper.py OWNER ENGINE...``
(``OWNER``: ``PID:START``).

Started by the container back end before a process's first container, in a session of its
own (a Ctrl-C or a kill of the process group leaves it running). It waits for the process
``PID`` (started at ``START``) to exit, however it exits, then removes every container labelled
with its ``PID:START`` (``envhub.owner``), running or not, through the engine's command line
(``ENGINE...``: ``podman`` and its global flags). A SIGTERM makes it exit without removing
anything. It imports only the standard library (it runs as a file, not through ``envhub``).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

OWNER_LABEL = "envhub.owner"
"""The label (:data:`envhub.sandbox.container_engine.OWNER_LABEL`)."""
POLL_S = 1.0
"""How often to look when the kernel has no pidfds."""


def started(pid: int) -> str | None:
    """``PID``'s start time from /proc (``None`` when it is not running)."""
    try:
        stat = open(f"/proc/{pid}/stat").read()  # noqa: SIM115 - read at once
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def wait_gone(pid: int, start: str) -> None:
    """Return once the process ``pid`` started at ``start`` no longer runs."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        fd = None
    if fd is not None and started(pid) == start:
        select.select([fd], [], [])
        return
    while started(pid) == start:
        time.sleep(POLL_S)


def remove_owned(engine: list[str], owner: str) -> None:
    """Remove every container labelled ``owner`` (twice: one may have been starting)."""
    for _ in range(2):
        listed = subprocess.run(
            [*engine, "ps", "-a", "-q", "--no-trunc", "--filter", f"label={OWNER_LABEL}={owner}"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        ids = listed.stdout.split()
        if not ids:
            return
        subprocess.run([*engine, "rm", "-f", "-t", "0", *ids], capture_output=True, timeout=300)


def main() -> None:
    """The command line (see the module's docstring)."""
    owner, engine = sys.argv[1], sys.argv[2:]
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    pid, _, start = owner.partition(":")
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    wait_gone(int(pid), start)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # from here on, finish the removal
    remove_owned(engine, owner)


if __name__ == "__main__":
    main()
