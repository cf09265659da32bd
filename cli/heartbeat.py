"""A line every few seconds about the step in progress, for output that is not a terminal.

On a terminal the live progress bar shows what a step is doing; in a log file or CI it prints
nothing, and a training step of a minute looks like a hang. :class:`Heartbeat` prints
``step 3/10: rolling out 12/32 episodes, 18 s`` every ``logging.heartbeat_seconds`` instead,
from a thread of its own (the update holds the event loop's attention for most of a step).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

PHASES = {
    "rollout": "rolling out",
    "prepare": "scoring and building the batch",
    "logprobs": "computing logprobs",
    "values": "computing the critic's values",
    "update": "updating the policy",
    "critic": "updating the critic",
    "sync": "syncing the engine's weights",
    "eval": "held-out evaluation",
    "checkpoint": "saving a checkpoint",
    "export": "exporting the final model",
}
"""How each phase (``Reporter.phase``) reads in a heartbeat line."""


class Heartbeat:
    """What the run is doing now, and a line saying so once ``every`` seconds have passed
    without output.

    Args:
        every: Seconds between lines.
        steps: The run's steps.
        write: Prints one line.
        clock: Seconds from a fixed point (tests pass their own).
    """

    def __init__(
        self,
        every: float,
        steps: int,
        write: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.every, self.steps, self.write, self.clock = every, steps, write, clock
        self.finished = 0
        self.phase = "rollout"
        self.done: int | None = None
        self.total: int | None = None
        self.since = self.last_line = clock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def finish_step(self, step: int) -> None:
        """Step ``step`` printed its row: that counts as output."""
        self.finished = step
        self.since = self.last_line = self.clock()

    def enter(self, phase: str) -> None:
        """The run entered ``phase``; ``rollout`` is the first phase of a step, and the
        seconds count from it (and from ``export``)."""
        if phase in ("rollout", "export"):
            self.done = self.total = None
            self.since = self.clock()
        self.phase = phase

    def progress(self, done: int, total: int) -> None:
        """``done`` of the ``total`` episodes the next update needs are ready."""
        self.done, self.total = done, total

    def line(self) -> str:
        """``step 3/10: rolling out 12/32 episodes, 18 s``: the step (the one in progress; for
        a checkpoint or the export, the last one done), the phase, and the seconds since the
        step's row (the step's rollout, the export) began."""
        what = PHASES.get(self.phase, self.phase)
        if self.phase == "rollout" and self.total is not None:
            what += f" {self.done}/{self.total} episodes"
        step = self.finished if self.phase in ("checkpoint", "export") else self.finished + 1
        return f"step {step}/{self.steps}: {what}, {self.clock() - self.since:.0f} s"

    def due(self) -> str | None:
        """The line to print now, if ``every`` seconds passed since the last output; it then
        counts as output."""
        now = self.clock()
        if now - self.last_line < self.every:
            return None
        self.last_line = now
        return self.line()

    def start(self) -> None:
        """Check every second (or ``every``, if shorter) on a daemon thread, until :meth:`stop`."""
        self._thread = threading.Thread(target=self._beat, name="envhub-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _beat(self) -> None:
        while not self._stop.wait(min(self.every, 1.0)):
            text = self.due()
            if text is not None:
                self.write(text)
