"""A run that trains on nothing says so, and stops.

With dynamic sampling on an env that rewards every sample the same (all 0: the task is too
hard, the reward is broken, the answer format never matches), every group is dropped: each
step rolls out, keeps nothing and updates nothing. :class:`EmptySteps` warns on the first such
step with the reason (:func:`envhub.trainer.batch.no_signal`) and stops the run after
``algorithm.max_empty_steps`` of them in a row, unless that is ``null``. Steps where every
episode passed do not count towards the stop: the policy solves what it drew, nothing is broken
(a converged quickstart would otherwise stop by chance); the first one is reported.
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
    said_solved: bool = False

    def observe(self, step: int, empty: NoSignal | None) -> None:
        """Record step ``step`` (counted from 1): ``empty`` says why it had nothing to learn
        from, ``None`` that it had something. Raises :class:`NoLearningSignalError` at the
        limit."""
        if empty is None or empty.solved:
            self.streak = 0
            if empty is not None and not self.said_solved:
                self.said_solved = True
                log.warning("step %d: every episode passed, nothing to learn from", step)
            return
        self.streak += 1
        if self.streak == 1:
            log.warning("step %d trained on nothing: %s", step, empty.reason)
        if self.limit is not None and self.streak >= self.limit:
            raise NoLearningSignalError(
                f"stopped after {self.streak} steps in a row with nothing to learn from "
                f"(steps {step - self.streak + 1}-{step}): {empty.reason}. Check that the env "
                "can reward this model (`envhub eval ENV --serve -m MODEL`), make the task "
                "easier, or set algorithm.max_empty_steps: null to keep going; the last "
                "checkpoint resumes the run."
            )
