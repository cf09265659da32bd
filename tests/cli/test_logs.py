"""envhub's log lines reach stderr as plain lines, warnings marked."""

from __future__ import annotations

import logging

import pytest

from envhub.cli.logs import StderrLines, show_envhub_logs


@pytest.fixture
def envhub_logger():
    logger = logging.getLogger("envhub")
    before = (list(logger.handlers), logger.level, logger.propagate)
    yield logger
    logger.handlers[:], logger.level, logger.propagate = before


def test_info_and_warnings_of_envhub_loggers_go_to_stderr_once(envhub_logger, capsys) -> None:
    show_envhub_logs()
    show_envhub_logs()  # a second call adds nothing
    assert sum(isinstance(h, StderrLines) for h in envhub_logger.handlers) == 1
    logging.getLogger("envhub.inference.vllm_server").info("vLLM ready after %d s", 41)
    logging.getLogger("envhub.trainer.no_signal").warning("step 1 trained on nothing: tied")
    logging.getLogger("envhub.trainer").debug("not shown")
    assert capsys.readouterr().err.splitlines() == [
        "vLLM ready after 41 s",
        "warning: step 1 trained on nothing: tied",
    ]
