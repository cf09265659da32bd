"""The wire types' provenance and outcome fields: older files still load, outcomes have a fixed
precedence, infrastructure errors are told from the env's own."""

from __future__ import annotations

import hashlib

import httpx
import pytest

from envhub.errors import EngineUnavailableError, SandboxError
from envhub.rollout.io import read_trajectories
from envhub.types import (
    ErrorRecord,
    Trajectory,
    TurnRecord,
    episode_outcome,
    is_infrastructure_error,
    template_sha256,
)

# Two lines as envhub wrote them before trajectories recorded the sampler, outcomes and
# ErrorRecord.infra / TurnRecord.structured_tool_calls.
OLD_LINES = (
    '{"env": {"name": "quiz", "version": "1.2.3", "commit": null}, "task_index": 3, '
    '"sample_index": 0, "group_id": "g0", "seed": 7, "messages": [{"role": "user", "content": '
    '"q3", "tool_calls": null, "tool_call_id": null, "name": null}], "prompt_length": 1, '
    '"tools": null, "token_ids": null, "loss_mask": null, "sampler_logprobs": null, '
    '"prompt_token_count": null, "reward": 0.0, "reward_components": {}, "terminated": false, '
    '"truncated": true, "stop_reason": "error", "turns": [], "metrics": {}, "errors": '
    '[{"stage": "engine", "type": "EngineError", "message": "model crashed", "turn": 0}], '
    '"token_drift": [], "info": {}, "seconds": 0.0}\n'
    '{"env": {"name": "quiz", "version": "1.2.3", "commit": null}, "task_index": 0, '
    '"group_id": "g1", "messages": [], "prompt_length": 0, "reward": 1.0, "truncated": true, '
    '"stop_reason": "max_turns", "turns": [{"completion_tokens": 4, "finish_reason": "stop"}], '
    '"errors": [{"stage": "reward:judge", "type": "SandboxUnavailableError", "message": "x"}]}\n'
)


def test_trajectory_files_written_before_provenance_and_outcomes_load(tmp_path) -> None:
    path = tmp_path / "old.jsonl"
    path.write_text(OLD_LINES)
    engine, sandbox = read_trajectories(path)
    assert (engine.sampler, engine.outcome, engine.errors[0].infra) == (None, "infra_failure", True)
    assert (sandbox.outcome, sandbox.errors[0].infra) == ("infra_failure", True)
    assert sandbox.turns == [TurnRecord(completion_tokens=4, finish_reason="stop")]
    assert sandbox.turns[0].structured_tool_calls is False


def error(stage: str, type: str = "ValueError", **kwargs) -> ErrorRecord:
    return ErrorRecord(stage=stage, type=type, message="m", **kwargs)


@pytest.mark.parametrize(
    ("errors", "truncated", "outcome"),
    [
        ([], False, "ok"),
        ([], True, "policy_failure"),
        ([error("reward:exact")], False, "env_failure"),
        ([error("env.step", "timeout")], True, "timeout"),
        ([error("env.step", "timeout"), error("reward:exact")], True, "timeout"),
        ([error("episode", "timeout"), error("engine", "EngineError")], True, "infra_failure"),
        (
            [error("reward:judge", "HTTPError", infra=True), error("env.step")],
            True,
            "infra_failure",
        ),
    ],
)
def test_outcomes_take_precedence_infra_then_timeout_then_env(errors, truncated, outcome) -> None:
    assert episode_outcome(errors, truncated) == outcome
    assert (
        Trajectory.model_validate(
            {"env": {"name": "e"}, "task_index": 0, "group_id": "g", "messages": [],
             "prompt_length": 0, "errors": errors, "truncated": truncated}
        ).outcome
        == outcome
    )  # fmt: skip


def test_infrastructure_errors_are_the_engines_sandboxes_and_the_networks() -> None:
    request = httpx.Request("GET", "http://127.0.0.1:9/")
    infra = [
        EngineUnavailableError("gone"),
        SandboxError("no bwrap"),
        ConnectionResetError("reset"),
        httpx.ConnectError("refused", request=request),
        httpx.HTTPStatusError("503", request=request, response=httpx.Response(503)),
    ]
    env = [ValueError("bad"), KeyError("k"), TimeoutError(), OSError("disk")]
    assert [is_infrastructure_error(e) for e in infra + env] == [True] * 5 + [False] * 4


def test_template_hash_is_the_sha256_of_the_template_text() -> None:
    text = "{% for m in messages %}{{ m.content }}{% endfor %}"
    assert template_sha256(text) == hashlib.sha256(text.encode()).hexdigest()
    assert (
        template_sha256({"default": text})
        == hashlib.sha256(
            b'{"default": "{% for m in messages %}{{ m.content }}{% endfor %}"}'
        ).hexdigest()
    )
    assert template_sha256(None) is None and template_sha256("") is None
