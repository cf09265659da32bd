"""A verifiers 0.4 (v1) environment as a harness env: verifiers' own rollout, in its own venv,
played by a scripted token-level policy; the reward is verifiers' reward.

The episodes need the separate venv (``bash scripts/verifiers_v1_venv.sh`` makes
``.venv-verifiers``, ~570 MB, a few minutes); without it they skip. CI does not build it."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest

from envhub.adapters.verifiers.v1 import VerifiersV1Env, VerifiersV1Rubric, find_python
from envhub.errors import EnvLoadError, MissingDependencyError
from envhub.rollout.runner import RolloutRunner
from envhub.state import State
from envhub.testing import ByteChatTokenizer, ScriptedEngine
from envhub.types import Message, Trajectory
from tests.harness.test_env import sampled_runs

pytest.importorskip("openai")
pytest.importorskip("uvicorn")

try:
    find_python()
    NO_VENV = ""
except MissingDependencyError:
    NO_VENV = (
        "the verifiers 0.4 venv (.venv-verifiers) is missing: `bash scripts/verifiers_v1_venv.sh` "
        "makes it (CI does not build it: ~570 MB, a few minutes), or set "
        "ENVHUB_VERIFIERS_V1_PYTHON"
    )
needs_venv = pytest.mark.skipif(bool(NO_VENV), reason=NO_VENV)

SUM = re.compile(r"What is (\d+) \+ (\d+)\?")


def answer(messages: list[Message], tools: Any) -> str:
    """The right sum, boxed (vf-arith-v1's correct answer: reward 1.0 + 0.2)."""
    a, b = SUM.search(messages[-1].content or "").groups()
    return f"{a} plus {b} is \\boxed{{{int(a) + int(b)}}}."


def off_by_one(messages: list[Message], tools: Any) -> str:
    """A wrong sum, boxed: only the format reward (0.2)."""
    a, b = SUM.search(messages[-1].content or "").groups()
    return f"\\boxed{{{int(a) + int(b) + 1}}}"


def rollout(env_factory: Any, policy: Any, tasks: list[int]) -> list[Trajectory]:
    engine = ScriptedEngine(policy, ByteChatTokenizer())
    return asyncio.run(RolloutRunner(engine, env_factory).run(tasks))


def arith(**kwargs: Any) -> VerifiersV1Env:
    return VerifiersV1Env("vf-arith-v1", {"num_tasks": 4, "seed": 7}, **kwargs)


@needs_venv
def test_a_right_answer_earns_verifiers_reward_and_records_exactly_the_sampled_turn() -> None:
    (traj,) = rollout(arith, answer, [2])
    assert traj.outcome == "ok" and traj.errors == []
    assert traj.reward == 1.2  # correct (1.0 x 1.0) + boxed (0.2 x 1.0)
    assert traj.reward_components == {"correct": 1.0, "boxed": 1.0}
    # verifiers' chat loop sent the task's prompt as it is: one user message, no tools.
    assert [m.role for m in traj.messages] == ["user", "assistant"]
    assert SUM.search(traj.messages[0].content or "")
    assert traj.messages[1].content == answer(traj.messages[:1], None)
    # Token by token: the record is the template's rendering of that conversation and only
    # the sampled turn (its text and end token) is in the loss.
    tokenizer = ByteChatTokenizer()
    rendered = tokenizer.render_sync(traj.messages, None, add_generation_prompt=False)
    assert traj.token_ids == rendered[:-1]
    (run,) = sampled_runs(traj.loss_mask)
    sampled = tokenizer.encode(traj.messages[1].content) + [tokenizer.eos_token_id]
    assert traj.token_ids[run[0] : run[1]] == sampled and sum(traj.loss_mask) == len(sampled)
    assert traj.prompt_token_count == run[0]


@needs_venv
def test_a_wrong_answer_earns_only_the_format_reward() -> None:
    (traj,) = rollout(arith, off_by_one, [0])
    assert traj.outcome == "ok" and traj.errors == []
    assert traj.reward == 0.2
    assert traj.reward_components == {"correct": 0.0, "boxed": 1.0}


@needs_venv
def test_a_row_of_task_data_is_a_task_and_an_unboxed_reply_scores_zero() -> None:
    rows = [{"prompt": "What is 20 + 22? Put the final answer in \\boxed{}.", "answer": "42"}]
    env = lambda: arith(dataset=rows)  # noqa: E731
    right, unboxed = (
        rollout(env, answer, [0])[0],
        rollout(env, lambda m, t: "forty-two", [0])[0],
    )
    assert right.messages[0].content == rows[0]["prompt"]
    assert right.reward == 1.2
    assert unboxed.outcome == "ok" and unboxed.reward == 0.0
    assert unboxed.reward_components == {"correct": 0.0, "boxed": 0.0}


@needs_venv
def test_an_unknown_taskset_fails_at_construction_with_verifiers_message() -> None:
    with pytest.raises(EnvLoadError, match="no-such-taskset"):
        VerifiersV1Env("no-such-taskset")


def test_a_missing_venv_fails_at_construction_with_the_commands_that_make_it(
    monkeypatch: Any, tmp_path: Any
) -> None:
    monkeypatch.setenv("ENVHUB_VERIFIERS_V1_PYTHON", str(tmp_path / "no-such-python"))
    with pytest.raises(MissingDependencyError) as caught:
        VerifiersV1Env("vf-arith-v1")
    message = str(caught.value)
    assert "bash scripts/verifiers_v1_venv.sh" in message
    assert "python3 -m venv .venv-verifiers" in message and "verifiers==0.4.0" in message


def test_the_rubric_reads_the_last_result_line_and_logs_verifiers_metrics() -> None:
    result = {"reward": 0.7, "rewards": {"a": 0.5, "b": 1.0}, "metrics": {"calls": 3}}
    state = State(task={}, task_index=0, prompt=[], messages=[])
    state.data["result"] = "a log line\n" + json.dumps(result)
    score = asyncio.run(VerifiersV1Rubric().score(state))
    assert score.total == 0.7 and score.components == {"a": 0.5, "b": 1.0} and not score.errors
    assert state.metrics["verifiers/calls"] == 3.0
    state.data["result"] = "no json here"
    bad = asyncio.run(VerifiersV1Rubric().score(state))
    assert bad.total == 0.0 and bad.errors[0].stage == "reward:verifiers"
    assert "printed no verifiers result line" in bad.errors[0].message
    cut = State(task={}, task_index=0, prompt=[], messages=[])  # cut before the program ended
    assert asyncio.run(VerifiersV1Rubric().score(cut)).total == 0.0
