"""Every way a harness episode can fail is recorded on it as the right kind; the batch goes on."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from envhub.harness import HarnessEnv
from envhub.rewards.rubric import Rubric, reward
from envhub.rollout.runner import RolloutRunner
from envhub.state import State
from envhub.testing import ByteChatTokenizer, ScriptedEngine
from envhub.types import Trajectory

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

TASKS = [{"question": "say hi"}]


def rollout(program: Any, policy: Any = lambda m, t: "hi", **env_args: Any) -> Trajectory:
    engine = ScriptedEngine(policy, ByteChatTokenizer())
    runner = RolloutRunner(engine, lambda: HarnessEnv(program, TASKS, **env_args))
    (traj,) = asyncio.run(runner.run([0]))
    return traj


async def ask(client: Any, text: str = "hi", **extra: Any) -> str:
    reply = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": text}], **extra
    )
    return reply.choices[0].message.content


def only_error(traj: Trajectory) -> tuple[str, str]:
    (error,) = traj.errors
    return error.stage, error.type


def test_a_program_that_raises_after_a_call_is_an_env_failure_not_a_zero() -> None:
    async def program(client: Any) -> str:
        await ask(client)
        raise RuntimeError("the agent's parser broke")

    traj = rollout(program)
    assert traj.outcome == "env_failure"
    assert only_error(traj) == ("harness.crash", "crash")
    assert "RuntimeError: the agent's parser broke" in traj.errors[0].message
    assert traj.turns and traj.loss_mask is not None and sum(traj.loss_mask) == 3  # "hi" + eos


def test_a_program_that_makes_no_call_fails_at_reset_and_says_what_it_returned() -> None:
    traj = rollout(lambda: "done")
    assert traj.outcome == "env_failure" and traj.turns == []
    (error,) = traj.errors
    assert error.stage == "env.reset" and error.type == "HarnessError"
    assert "made no call to the endpoint: it returned 'done'" in error.message


def test_a_program_that_runs_over_its_time_is_a_timeout() -> None:
    async def program(client: Any) -> str:
        await ask(client)
        await asyncio.sleep(3600)
        return "never"

    started = time.monotonic()
    traj = rollout(program, timeout=0.5)
    assert time.monotonic() - started < 60  # the program was stopped, not waited for
    assert traj.outcome == "timeout"
    assert only_error(traj) == ("harness.program", "timeout")
    assert "ran over 0.5 s" in traj.errors[0].message


def test_a_request_that_would_bias_training_is_refused_with_the_reason() -> None:
    seen: list[str] = []

    async def program(client: Any) -> str:
        try:
            await ask(client, top_p=0.9)
        except openai.BadRequestError as e:
            seen.append(e.message)
        return await ask(client)

    traj = rollout(program)
    assert len(seen) == 1 and "top_p=0.9" in seen[0] and "biases" in seen[0]
    assert traj.outcome == "env_failure"
    assert only_error(traj) == ("harness.request", "bad_request")
    assert "top_p=0.9" in traj.errors[0].message


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ({"n": 2}, "n=2"),
        ({"logit_bias": {"5": 10}}, "logit_bias"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
    ],
)
def test_other_biasing_fields_are_refused(extra: dict[str, Any], said: str) -> None:
    async def program(client: Any) -> str:
        try:
            return await ask(client, **extra)
        except openai.BadRequestError as e:
            return e.message

    traj = rollout(program)
    assert traj.outcome == "env_failure" and said in traj.errors[0].message
    assert traj.errors[0].stage == "env.reset"  # refused before any call: no episode started


def test_a_program_past_its_call_budget_is_cut_and_scored_as_the_policys_failure() -> None:
    calls: list[int] = []

    async def program(client: Any) -> str:
        messages = [{"role": "user", "content": "go"}]
        while True:  # never satisfied
            reply = await client.chat.completions.create(model="m", messages=messages)
            calls.append(1)
            messages += [
                reply.choices[0].message.model_dump(exclude_none=True),
                {"role": "user", "content": "more"},
            ]

    traj = rollout(program, max_turns=3)
    assert traj.outcome == "policy_failure" and traj.errors == []
    assert traj.stop_reason == "max_turns" and len(traj.turns) == 3
    assert len(calls) == 3  # the fourth call was refused when the episode ended


def test_a_command_that_exits_non_zero_is_recorded_with_its_stderr() -> None:
    script = textwrap.dedent(
        """
        import openai, sys
        client = openai.OpenAI()
        question = {"role": "user", "content": sys.stdin.read()}
        client.chat.completions.create(model="m", messages=[question])
        print("tool failed: disk full", file=sys.stderr)
        sys.exit(3)
        """
    )
    traj = rollout([sys.executable, "-c", script])
    assert traj.outcome == "env_failure"
    assert only_error(traj) == ("harness.exit", "exit")
    assert "exited with status 3: tool failed: disk full" in traj.errors[0].message


def test_a_command_that_cannot_start_fails_at_reset() -> None:
    traj = rollout(["/nonexistent/agent"])
    (error,) = traj.errors
    assert traj.outcome == "env_failure" and error.stage == "env.reset"
    assert "cannot start /nonexistent/agent" in error.message


def test_a_command_agent_is_scored_on_its_stdout_and_its_children_do_not_outlive_it(
    tmp_path: Path,
) -> None:
    pid_file = tmp_path / "child.pid"
    script = textwrap.dedent(
        f"""
        import os, subprocess, sys, openai
        child = subprocess.Popen(["sleep", "600"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        client = openai.OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY come from the env
        question = sys.stdin.read()
        reply = client.chat.completions.create(
            model=os.environ["OPENAI_MODEL"], messages=[{{"role": "user", "content": question}}]
        )
        print(reply.choices[0].message.content)
        """
    )
    traj = rollout(
        [sys.executable, "-c", script],
        lambda m, t: f"{m[-1].content}: 42",
        rubric=Rubric([printed_the_answer]),
    )
    assert traj.outcome == "ok" and traj.errors == []
    assert traj.reward_components == {"printed_the_answer": 1.0}
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 30
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


@reward
def printed_the_answer(state: State) -> float:
    return float(state.data["result"] == "say hi: 42")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat")
    return status.exists() and status.read_text().split()[2] != "Z"


def test_an_agent_that_gives_up_on_the_policys_turn_is_the_policys_failure() -> None:
    agents = pytest.importorskip("agents")

    @agents.function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    async def program(client: Any, prompt: str) -> str:
        agents.set_tracing_disabled(True)
        model = agents.OpenAIChatCompletionsModel(model="policy", openai_client=client)
        agent = agents.Agent(name="adder", tools=[add], model=model)
        return str((await agents.Runner.run(agent, prompt)).final_output)

    # A call to a tool the agent does not have: the Agents SDK raises ModelBehaviorError.
    unknown = '<tool_call>{"name": "multiply", "arguments": {"a": 2}}</tool_call>'
    traj = rollout(program, lambda m, t: unknown)
    assert traj.errors == [] and traj.outcome == "policy_failure"
    assert traj.stop_reason == "program_gave_up" and len(traj.turns) == 1
    assert traj.loss_mask is not None and sum(traj.loss_mask) == len(unknown.encode()) + 1


def test_a_program_can_say_the_policy_failed() -> None:
    from envhub.harness import PolicyFailure

    async def program(client: Any) -> str:
        if await ask(client) != "a number":
            raise PolicyFailure("the model did not answer with a number")
        return "ok"

    traj = rollout(program)
    assert traj.outcome == "policy_failure" and traj.stop_reason == "program_gave_up"
