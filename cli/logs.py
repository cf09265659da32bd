"""envhub's own log lines on stderr: engine start progress, warnings such as a training step
that had nothing to learn from.

Records of the ``envhub`` loggers at INFO and above are written as one plain line each
(``warning: ...`` for warnings and errors) to whatever ``sys.stderr`` is when they are
emitted, so rich's live progress display, which redirects it, keeps them above its bars.
Other libraries' loggers are left as they are.
"""

from __future__ import annotations

import logging
import sys


class StderrLines(logging.Handler):
    """Writes each record as one line to the current ``sys.stderr``."""

    def emit(self, record: logging.LogRecord) -> None:
        """Write ``record``; ``warning:``/``error:`` prefixes mark the serious ones."""
        try:
            message = record.getMessage()
            if record.levelno >= logging.WARNING:
                message = f"{record.levelname.lower()}: {message}"
            sys.stderr.write(message + "\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - logging must never break the command
            self.handleError(record)


def show_envhub_logs(level: int = logging.INFO) -> None:
    """Route the ``envhub`` loggers to stderr at ``level`` (once; later calls do nothing)."""
    logger = logging.getLogger("envhub")
    if any(isinstance(h, StderrLines) for h in logger.handlers):
        return
    logger.addHandler(StderrLines())
    logger.setLevel(level)
    logger.propagate = False  # one line per record, not another from the root's handler
