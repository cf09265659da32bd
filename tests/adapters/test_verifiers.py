"""The verifiers adapter against real verifiers environments, built with verifiers' own classes.

Each episode is run twice on the same scripted turns: by envhub's runner through the adapter,
and by verifiers itself (``env.rollout`` with a verifiers client that answers from the same
policy, then the env's rubric). Prompts, completions, rewards and components must be equal.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

vf = pytest.importorskip("verifiers")
pytest.importorskip("verifiers.legacy")

from datasets import Dataset  # noqa: E402
from typer.testing import CliRunner  # noqa: E402
from verifiers.clients.client import Client  # noqa: E402
from verifiers.types import Response, ResponseMessage, ToolCall  # noqa: E402

import envhub  # noqa: E402
from envhub.adapters import list_adapted  # noqa: E402
from envhub.adapters import verifiers as adapter  # noqa: E402
from envhub.checks.checker import check_env  # noqa: E402
from envhub.cli.app import app  # noqa: E402
from envhub.rollout.runner import RolloutRunner  # noqa: E402
from envhub.testing import ByteChatTokenizer, ScriptedEngine  # noqa: E402
from envhub.types import Message, Trajectory  # noqa: E402

Policy = Callable[[list[Any], Any], str]
SYSTEM = "Answer with a number only."
SUMS = [
    {"question": f"What is {a}+{b}?", "answer": str(a + b)} for a, b in [(2, 3), (4, 4), (7, 5)]
]


# -- three small verifiers environments --------------------------------------------------------


def exact(completion, answer) -> float:
    """1 when the last message is exactly the answer."""
    return float((completion[-1].content or "").strip() == answer)


def short(completion) -> float:
    """1 for a reply of at most 3 characters."""
    return float(len(completion[-1].content or "") <= 3)


def single_turn(*funcs: Callable[..., float], weights: list[float] | None = None) -> Any:
    funcs = funcs or (exact, short)
    rubric = vf.Rubric(funcs=list(funcs), weights=weights or [1.0, 0.5][: len(funcs)])
    return vf.SingleTurnEnv(dataset=Dataset.from_list(SUMS), system_prompt=SYSTEM, rubric=rubric)


class GuessEnv(vf.MultiTurnEnv):
    """Guess the answer; the env says higher or lower; 4 guesses."""

    async def env_response(self, messages, state, **kwargs):
        guess = messages[-1].content.strip()
        target = int(state["answer"])
        if guess.isdigit() and int(guess) == target:
            state["final_env_response"] = [vf.UserMessage(content="Correct!")]
            return []
        hint = "higher" if not guess.isdigit() or int(guess) < target else "lower"
        return [vf.UserMessage(content=f"No, {hint}.")]


def guessed(completion, answer) -> float:
    """1 when some assistant turn was the answer."""
    return float(any(m.role == "assistant" and m.content.strip() == answer for m in completion))


def guess_env() -> Any:
    rubric = vf.Rubric(funcs=[guessed])
    return GuessEnv(dataset=Dataset.from_list(SUMS), system_prompt=SYSTEM, rubric=rubric,
                    max_turns=4)  # fmt: skip


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def tool_env() -> Any:
    return vf.ToolEnv(
        tools=[add],
        dataset=Dataset.from_list(SUMS),
        system_prompt="Use the add tool, then answer with the number.",
        rubric=vf.Rubric(funcs=[exact]),
        max_turns=3,
    )


# -- scripted policies (they read .role/.content: verifiers' and envhub's messages alike) ------


def _numbers(messages: list[Any]) -> list[int]:
    question = next(m.content for m in messages if m.role == "user")
    return [int(x) for x in re.findall(r"\d+", question)]


def solver(messages: list[Any], tools: Any) -> str:
    return str(sum(_numbers(messages)))


def counter(messages: list[Any], tools: Any) -> str:
    """Guesses 5, then walks by the env's hints (1 up or down)."""
    mine = [m.content for m in messages if m.role == "assistant"]
    if not mine:
        return "5"
    step = 1 if "higher" in messages[-1].content else -1
    return str(int(mine[-1]) + step)


def tool_user(messages: list[Any], tools: Any) -> str:
    if messages[-1].role == "tool":
        return messages[-1].content
    a, b = _numbers(messages)
    return f'<tool_call>{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'


# -- both sides --------------------------------------------------------------------------------


class ScriptedClient(Client):
    """A verifiers client answering from a policy, with tool calls parsed as a server would."""

    def __init__(self, policy: Policy) -> None:
        super().__init__(None)
        self.policy = policy

    def setup_client(self, config: Any) -> None:
        return None

    async def to_native_tool(self, tool: Any) -> Any:
        return tool

    async def to_native_prompt(self, messages: Any) -> tuple[Any, dict]:
        return messages, {}

    async def get_native_response(self, prompt, model, sampling_args, tools=None, **kwargs):
        text = self.policy(list(prompt), tools)
        calls = [
            ToolCall(id=f"c{i}", name=c["name"], arguments=json.dumps(c["arguments"]))
            for i, c in enumerate(
                map(json.loads, re.findall(r"<tool_call>(.*?)</tool_call>", text))
            )
        ]
        message = ResponseMessage(
            content=text, tool_calls=calls or None, finish_reason="stop", is_truncated=False
        )
        return Response(id="r", created=0, model=model, message=message)

    async def raise_from_native_response(self, response: Any) -> None:
        return None

    async def from_native_response(self, response: Any) -> Any:
        return response

    async def close(self) -> None:
        return None


def verifiers_run(vf_env: Any, policy: Policy, task: int) -> Any:
    """verifiers' own episode of ``task``: its rollout, then its rubric's score."""

    async def run() -> Any:
        row = vf_env.get_dataset()[task]
        state = await vf_env.rollout(row, ScriptedClient(policy), "scripted", {})
        await vf_env.rubric.score_rollout(state)
        return state

    return asyncio.run(run())


def envhub_run(vf_env: Any, policy: Policy, tasks: list[int]) -> list[Trajectory]:
    engine = ScriptedEngine(policy, ByteChatTokenizer())
    runner = RolloutRunner(engine, lambda: adapter.from_verifiers(vf_env))
    return asyncio.run(runner.run(tasks))


def pairs(messages: list[Any]) -> list[tuple[str, str]]:
    return [(m.role, m.content or "") for m in messages]


def assert_same_episode(trajectory: Trajectory, state: Any) -> None:
    split = trajectory.prompt_length
    assert pairs(trajectory.messages[:split]) == pairs(state["prompt"])
    assert pairs(trajectory.messages[split:]) == pairs(state["completion"])
    assert trajectory.reward == state["reward"]
    assert trajectory.reward_components == state["metrics"]
    assert trajectory.errors == []


def assert_exact_tokens(trajectory: Trajectory) -> None:
    """The record is the rendered conversation; the mask covers the sampled turns only."""
    tokenizer = ByteChatTokenizer()
    ids, mask = trajectory.token_ids, trajectory.loss_mask
    messages = trajectory.messages
    if messages[-1].role != "assistant":  # the env's last reply was never answered
        messages = messages[: max(i for i, m in enumerate(messages) if m.role == "assistant") + 1]
    plain = [Message(role=m.role, content=m.content) for m in messages]
    assert ids == tokenizer.render_sync(plain, trajectory.tools, False)[:-1]  # no "\n" after
    sampled = [t for t, m in zip(ids, mask, strict=True) if m]
    turns = [m.content or "" for m in messages if m.role == "assistant"]
    assert sampled == [t for text in turns for t in tokenizer.encode(text) + [tokenizer.IM_END]]
    runs = "".join(map(str, mask)).split("0")
    assert len([r for r in runs if r]) == len(turns)  # one span of 1s per sampled turn


# -- the tests ---------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", [solver, lambda m, t: "nine"], ids=["right", "wrong"])
def test_single_turn_matches_verifiers(policy: Policy) -> None:
    vf_env = single_turn()
    trajectories = envhub_run(vf_env, policy, [0, 1, 2])
    for task, trajectory in enumerate(trajectories):
        assert_same_episode(trajectory, verifiers_run(vf_env, policy, task))
        assert_exact_tokens(trajectory)
        assert (trajectory.terminated, trajectory.truncated) == (True, False)
    right = policy is solver
    assert [t.reward for t in trajectories] == [1.5 if right else 0.0] * 3
    assert trajectories[0].messages[:2] == [
        Message(role="system", content=SYSTEM),
        Message(role="user", content="What is 2+3?"),
    ]


def test_multi_turn_matches_verifiers() -> None:
    vf_env = guess_env()
    trajectories = envhub_run(vf_env, counter, [0, 1, 2])
    for task, trajectory in enumerate(trajectories):
        assert_same_episode(trajectory, verifiers_run(vf_env, counter, task))
        assert_exact_tokens(trajectory)
    # 2+3: 5 at once; 4+4: 5, 6, 7, 8 (the 4th and last turn); 7+5: 5..8, out of turns
    assert [len(t.turns) for t in trajectories] == [1, 4, 4]
    assert [t.reward for t in trajectories] == [1.0, 1.0, 0.0]
    assert [t.stop_reason for t in trajectories] == ["terminated", "max_turns", "max_turns"]
    assert pairs(trajectories[0].messages[2:]) == [("assistant", "5"), ("user", "Correct!")]
    assert pairs(trajectories[2].messages[3:5]) == [("user", "No, higher."), ("assistant", "6")]


def test_tool_calls_run_the_verifiers_tool_and_match() -> None:
    vf_env = tool_env()
    trajectories = envhub_run(vf_env, tool_user, [0, 1, 2])
    for task, trajectory in enumerate(trajectories):
        state = verifiers_run(vf_env, tool_user, task)
        assert_same_episode(trajectory, state)
        assert_exact_tokens(trajectory)
    first = trajectories[0]
    assert first.tools == [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Add two integers.",
                "parameters": vf_env.tool_defs[0].parameters,
                "strict": True,
            },
        }
    ]
    call, result, answer = first.messages[2:]
    assert call.tool_calls[0].function.name == "add"
    assert json.loads(call.tool_calls[0].function.arguments) == {"a": 2, "b": 3}
    assert (result.role, result.content, result.tool_call_id) == (
        "tool",
        "5",
        call.tool_calls[0].id,
    )
    assert (answer.role, answer.content) == ("assistant", "5")
    assert [t.reward for t in trajectories] == [1.0, 1.0, 1.0]
    assert [(t.tool_calls, t.tool_errors) for t in first.turns] == [(1, 0), (0, 0)]
    assert first.reward_components == {
        "exact": 1.0, "num_turns": 2.0, "total_tool_calls": 1.0, "add_calls": 1.0,
    }  # fmt: skip


def wrong_tool_user(messages: list[Any], tools: Any) -> str:
    """Calls ``subtract``, which the env does not have, until its turns run out."""
    a, b = _numbers(messages)
    return f'<tool_call>{{"name": "subtract", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'


def test_calls_to_a_tool_the_env_lacks_are_invalid_calls() -> None:
    from envhub.evaluation import summarize

    trajectories = envhub_run(tool_env(), wrong_tool_user, [0, 1])
    # 3 turns each, every one a call to a tool verifiers does not have (it says so to the model)
    assert [[(t.tool_calls, t.tool_errors) for t in x.turns] for x in trajectories] == [
        [(1, 1)] * 3
    ] * 2
    assert all("subtract" in x.messages[3].content for x in trajectories)
    summary = summarize(trajectories)
    assert (summary.tool_calls_total, summary.tool_validity, summary.tool_errors) == (
        6, 0.0, {"unknown_tool": 6},
    )  # fmt: skip


@pytest.mark.parametrize(
    "make", [lambda: single_turn(exact, weights=[1.0]), guess_env, tool_env],
    ids=["single_turn", "multi_turn", "tool"],
)  # fmt: skip
def test_check_env_passes(make: Callable[[], Any]) -> None:
    report = check_env(adapter.from_verifiers(make()), raise_on_failure=False)
    assert report.passed, report.failures


def test_a_crashing_reward_is_recorded_not_raised() -> None:
    def broken(completion) -> float:
        raise ZeroDivisionError("the reward divided by zero")

    vf_env = single_turn(exact, broken)
    trajectories = envhub_run(vf_env, solver, [0, 1])
    for task, trajectory in enumerate(trajectories):
        state = verifiers_run(vf_env, solver, task)
        assert (trajectory.reward, trajectory.reward_components) == (
            state["reward"],
            state["metrics"],
        )
        assert trajectory.reward == 1.0  # `broken` scored 0, as verifiers scores it
        assert [(e.stage, e.type, e.message, e.infra) for e in trajectory.errors] == [
            ("reward:broken", "ZeroDivisionError", "the reward divided by zero", False)
        ]
        assert trajectory.stop_reason == "terminated"


def test_an_env_that_raises_mid_episode_fails_that_episode_only() -> None:
    class Broken(vf.MultiTurnEnv):
        async def env_response(self, messages, state, **kwargs):
            if state["answer"] == "8":
                raise RuntimeError("env bug")
            return [vf.UserMessage(content="again")]

    vf_env = Broken(dataset=Dataset.from_list(SUMS), rubric=vf.Rubric(funcs=[exact]), max_turns=2)
    trajectories = envhub_run(vf_env, solver, [0, 1, 2])
    assert [t.stop_reason for t in trajectories] == ["max_turns", "error", "max_turns"]
    assert [(e.stage, e.type, e.message) for e in trajectories[1].errors] == [
        ("env.step", "RuntimeError", "env bug")
    ]
    assert [t.reward for t in trajectories] == [1.0, 0.0, 1.0]


def test_the_runners_token_budget_cuts_the_verifiers_rollout_and_scores_it() -> None:
    vf_env = guess_env()
    engine = ScriptedEngine(counter, ByteChatTokenizer(max_length=130))
    runner = RolloutRunner(engine, lambda: adapter.from_verifiers(vf_env))
    (trajectory,) = asyncio.run(runner.run([2]))
    assert trajectory.stop_reason == "max_context"
    assert trajectory.truncated and trajectory.errors == []
    assert trajectory.reward_components == {"guessed": 0.0, "num_turns": len(trajectory.turns)}


def test_group_rewards_are_scored_over_the_group() -> None:
    def distinct(completions) -> list[float]:
        texts = [c[-1].content for c in completions]
        return [1.0 / texts.count(t) for t in texts]

    vf_env = single_turn(exact, distinct)
    engine = ScriptedEngine(solver, ByteChatTokenizer())
    runner = RolloutRunner(engine, lambda: adapter.from_verifiers(vf_env))
    trajectories = asyncio.run(runner.run([0], samples_per_task=2))
    assert [t.reward for t in trajectories] == [1.25, 1.25]  # exact 1 + 0.5 x (1/2)
    assert trajectories[0].reward_components == {"exact": 1.0, "distinct": 0.5, "num_turns": 1.0}


def test_sync_api_works_inside_a_running_loop() -> None:
    env = adapter.from_verifiers(tool_env())

    async def inside() -> Any:
        env.reset(seed=0, options={"task_index": 1})
        observation, *_ = env.step(tool_user([Message(role="user", content="What is 4+4?")], None))
        return observation, env.step("8")

    observation, (_, reward, terminated, truncated, info) = asyncio.run(inside())
    assert [(m.role, m.content) for m in observation] == [("tool", "8")]
    assert (reward, terminated, truncated, info["stop_reason"]) == (1.0, True, False, "terminated")
    env.close()


def test_adapted_envs_are_made_in_worker_threads() -> None:
    made: list[Any] = []
    thread = threading.Thread(target=lambda: made.append(adapter.from_verifiers(guess_env())))
    thread.start()
    thread.join()
    assert made and made[0].reset(seed=0)[0]


def test_verifiers_still_installs_signal_handlers() -> None:
    """The off-main-thread shim exists for this; when it fails, verifiers changed: drop it."""
    source = inspect.getsource(vf.Environment.__post_init__)
    assert "signal.signal(" in source


# -- by name: an installed verifiers env package -----------------------------------------------

PACKAGE = """
import verifiers as vf
from datasets import Dataset


def exact(completion, answer) -> float:
    return float((completion[-1].content or "").strip() == answer)


def load_environment(count: int = 3):
    rows = [{"question": f"What is {i}+{i}?", "answer": str(2 * i)} for i in range(1, count + 1)]
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), system_prompt="Number only.",
                            rubric=vf.Rubric(funcs=[exact]))
"""


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``vf-tiny-sums`` installed as pip would leave it: a module and its dist-info."""
    (tmp_path / "vf_tiny_sums.py").write_text(textwrap.dedent(PACKAGE))
    info = tmp_path / "vf_tiny_sums-0.2.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vf-tiny-sums\nVersion: 0.2.0\n"
        "Summary: Doubles, as a verifiers env\nRequires-Dist: verifiers>=0.3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_make_and_list_by_name(installed: Path) -> None:
    assert adapter.list_envs()["vf-tiny-sums"] == "Doubles, as a verifiers env"
    assert list_adapted()["verifiers:vf-tiny-sums"] == "Doubles, as a verifiers env"
    env = envhub.make("verifiers:vf-tiny-sums", count=2)
    assert (env.name, env.version, len(env.dataset)) == ("verifiers:vf-tiny-sums", "0.2.0", 2)
    prompt, _ = env.reset(seed=0, options={"task_index": 1})
    assert pairs(prompt) == [("system", "Number only."), ("user", "What is 2+2?")]
    assert env.step("4")[1:4] == (1.0, True, False)
    with pytest.raises(envhub.errors.EnvNotFoundError, match="no verifiers environment"):
        envhub.make("verifiers:vf-not-there")


def test_cli_lists_and_checks_it(installed: Path) -> None:
    overview = CliRunner().invoke(app, ["list"], env={"COLUMNS": "200"})
    assert overview.exit_code == 0, overview.output
    row = next(line for line in overview.output.splitlines() if "verifiers:*" in line)
    assert "envhub list --framework verifiers" in row
    listed = CliRunner().invoke(app, ["list", "--framework", "verifiers"], env={"COLUMNS": "200"})
    assert listed.exit_code == 0, listed.output
    row = next(line for line in listed.output.splitlines() if "verifiers:vf-tiny-sums" in line)
    assert "Doubles, as a verifiers env" in row
    # a fresh process, as a user runs it
    checked = subprocess.run(
        [sys.executable, "-m", "envhub.cli", "check", "verifiers:vf-tiny-sums"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(installed), "COLUMNS": "200"},
        timeout=120,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "verifiers:vf-tiny-sums: passed" in checked.stdout
