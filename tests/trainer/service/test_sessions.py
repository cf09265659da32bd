"""Sessions whose client went silent: a service with a short ``session_timeout_s`` ends a
session that sent no heartbeat in time (freeing its model) and keeps one that did; a one-off
sample opens no sampling session."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

tinker = pytest.importorskip("tinker")

from tests.trainer.service.serving import Running, datums  # noqa: E402

TIMEOUT_S = 2.0
"""Shorter than the SDK's heartbeat period (10 s): its sessions expire, hand-fed ones live."""

EXAMPLES = [([1, 504, 3458, 314], [216, 28, 30, 2])]


@pytest.fixture(scope="module")
def service(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    running = Running(tmp_path_factory.mktemp("serve-trainer-sessions"),
                      models=(f"tiny={tiny_model_dir}",), session_timeout_s=TIMEOUT_S)  # fmt: skip
    yield running
    running.stop()


def _post(service: Running, route: str, body: dict[str, Any]) -> httpx.Response:
    headers = {"X-API-Key": service.settings.api_key}
    return httpx.post(f"{service.url}/api/v1/{route}", json=body, headers=headers, timeout=30)


def test_a_silent_session_ends_and_a_heartbeating_one_stays(service: Running) -> None:
    """The SDK's client heartbeats every 10 s, so with a 2 s timeout its session is ended as
    a crashed client's would be: its LoRA model is freed and later requests on it fail, and a
    heartbeat gets 410 (the SDK's signal to stop). A session heartbeating every 0.3 s stays."""
    state = service.app.app.state.service
    training = service.client().create_lora_training_client(base_model="tiny", rank=4).result()
    training.forward_backward(datums(EXAMPLES), "cross_entropy").result()
    session_id = training.model_id.split(":", 1)[0]
    kept = _post(service, "create_session", {}).json()["session_id"]
    deadline = time.monotonic() + 60
    while session_id in state.sessions:
        assert time.monotonic() < deadline, "the silent session was never ended"
        assert _post(service, "session_heartbeat", {"session_id": kept}).status_code == 200
        time.sleep(0.3)
    assert kept in state.sessions
    assert training.model_id not in state.models and state.bases == {}
    with pytest.raises(tinker.BadRequestError, match="its session has ended"):
        training.forward_backward(datums(EXAMPLES), "cross_entropy").result()
    gone = _post(service, "session_heartbeat", {"session_id": session_id})
    assert gone.status_code == 410
    assert f"session {session_id} has ended" in gone.json()["detail"]


def test_a_one_off_sample_opens_no_sampling_session(service: Running) -> None:
    state = service.app.app.state.service
    before = dict(state.sampling_sessions)
    body = {"base_model": "tiny", "num_samples": 1,
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 504, 3458]}]},
            "sampling_params": {"max_tokens": 2, "temperature": 0.0}}  # fmt: skip
    request_id = _post(service, "asample", body).json()["request_id"]
    for _ in range(30):  # the answer is the SDK's protobuf; a pending one is JSON
        done = _post(service, "retrieve_future", {"request_id": request_id})
        if "json" not in done.headers["content-type"]:
            break
        assert done.json()["type"] == "try_again", done.text
    assert done.status_code == 200 and done.content
    assert state.sampling_sessions == before
