"""The calculator-agent harness env: an Agents SDK agent on the calculator problems."""

from __future__ import annotations

import asyncio

import pytest

from envhub.checks.checker import check_env
from envhub.envs.calculator import reference_policy
from envhub.envs.calculator_agent import CalculatorAgentEnv
from envhub.rollout.runner import RolloutRunner
from envhub.testing import ByteChatTokenizer, ScriptedEngine, null_policy

pytest.importorskip("agents")


def test_the_reference_policy_solves_it_through_the_agent_in_two_calls() -> None:
    engine = ScriptedEngine(reference_policy, ByteChatTokenizer())
    env = lambda: CalculatorAgentEnv(num_tasks=4, call_reward=0.5)  # noqa: E731
    trajectories = asyncio.run(RolloutRunner(engine, env).run([0, 1, 2, 3]))
    for traj in trajectories:
        assert traj.outcome == "ok" and traj.errors == []
        assert [t.tool_calls for t in traj.turns] == [1, 0]
        # the right number pays 1, the first well-formed call 0.5 at once (on its turn)
        assert traj.reward == 1.5 and [t.reward for t in traj.turns] == [0.5, 1.0]
        assert traj.reward_components == {"tool_use": 0.5, "correct": 1.0, "tool_validity": 1.0}
        (tool_message,) = (m for m in traj.messages if m.role == "tool")
        assert traj.messages[-1].content == f"The result is \\boxed{{{tool_message.content}}}."


def test_the_demonstration_reaches_the_model_before_the_question() -> None:
    engine = ScriptedEngine(null_policy, ByteChatTokenizer())
    env = lambda: CalculatorAgentEnv(num_tasks=1, demonstration=True)  # noqa: E731
    (traj,) = asyncio.run(RolloutRunner(engine, env).run([0]))
    roles = [m.role for m in traj.messages[: traj.prompt_length]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert traj.messages[2].content.startswith("<tool_call>")
    assert traj.messages[3].content == "210"
    assert traj.messages[5].content.startswith("Compute: ")
    assert traj.reward == 0.0 and traj.outcome == "ok"  # an empty answer is wrong, not a failure


def test_it_passes_the_env_check_with_its_reference_policy() -> None:
    report = check_env(CalculatorAgentEnv(num_tasks=3, demonstration=True), raise_on_failure=False)
    assert report.failures == []
    assert "reference policy at top" in [r.name for r in report.results]
