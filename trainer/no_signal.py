"""A run that trains on nothing says so, and stops.

With dynamic sampling on an env that rewards every sample the same (all 0: the task is too
hard, the reward is broken, the answer format never matches), every group is dropped: each
step rolls out, keeps nothing and updates nothing. :class:`EmptySteps` warns on every such step:
the first of a streak (or one whose reason changed) with the reason
(:func:`envhub.trainer.batch.no_signal`), the next ones in one short line with the count, and
stops the run after ``algorithm.max_empty_steps`` of them in a row, unless that is ``null``.
Steps where every episode passed do not count towards the stop: the policy solves what it drew,
nothing is broken (a converged quickstart would otherwise stop by chance); each is reported the
same way.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from envhub.errors import NoLearningSignalError
from envhub.trainer.batch import NoSignal

log = logging.getLogger(__name__)


@dataclass
class EmptySteps:
    """Counts the steps in a row that had nothing to learn from.

    Args:
        limit: Steps in a row after which the run stops; ``None`` never stops it.
    """

    limit: int | None
    streak: int = 0
    """Steps in a row that trained on nothing, not solved (the stop counts these)."""
    solved_streak: int = 0
    """Steps in a row in which every episode passed."""
    last_reason: str | None = None
    """The reason last said in full, within the current streak."""

    def observe(self, step: int, empty: NoSignal | None) -> None:
        """Record step ``step`` (counted from 1): ``empty`` says why it had nothing to learn
        from, ``None`` that it had something. Warns on every step that had nothing; raises
        :class:`NoLearningSignalError` at the limit."""
        if empty is None or empty.solved:
            self.streak = 0
            self.solved_streak = self.solved_streak + 1 if empty is not None else 0
            if empty is not None:
                self._say_solved(step)
            return
        self.solved_streak = 0
        self.streak += 1
        if self.limit is not None and self.streak >= self.limit:
            raise NoLearningSignalError(
                f"stopped after {self.streak} steps in a row with nothing to learn from "
                f"(steps {step - self.streak + 1}-{step}): {empty.reason}. "
                + (f"{empty.hint[0].upper()}{empty.hint[1:]}. " if empty.hint else "")
                + "Check that the env can reward this model (`envhub eval ENV --serve -m "
                "MODEL`), make the task easier, or set algorithm.max_empty_steps: null to keep "
                "going; the last checkpoint resumes the run."
            )
        self._say(step, empty.reason, empty.hint)

    def _say_solved(self, step: int) -> None:
        again = f" again ({self.solved_streak} steps in a row)" if self.solved_streak > 1 else ""
        log.warning("step %d: every episode passed%s, nothing to learn from", step, again)

    def _say(self, step: int, reason: str, hint: str = "") -> None:
        """The reason (and what to do) in full on a streak's first step or when it changed;
        else one short line."""
        if self.streak == 1 or reason != self.last_reason:
            self.last_reason = reason
            log.warning(
                "step %d trained on nothing: %s%s", step, reason, f"; {hint}" if hint else ""
            )
            return
        stops = f", the run stops at {self.limit}" if self.limit is not None else ""
        log.warning(
            "step %d trained on nothing again: %d steps in a row%s (same reason)",
            step, self.streak, stops,
        )  # fmt: skip
