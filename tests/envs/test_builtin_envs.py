"""Every built-in env passes ``check_env``, and every reference policy wins through the real
rollout runner on the token-level path (scripted engine + byte tokenizer)."""

from __future__ import annotations

import asyncio

import pytest

import envhub
from envhub.checks.checker import check_env
from envhub.rollout.runner import RolloutRunner
from envhub.testing import ByteChatTokenizer, ScriptedEngine

BUILTIN = sorted(name for name, spec in envhub.list_envs().items() if spec.distribution == "envhub")
# Instances, not classes: the code envs build their reference policy from the loaded tasks.
WITH_REFERENCE = [name for name in BUILTIN if envhub.make(name).reference_policy is not None]


def test_the_catalog_lists_every_builtin_env() -> None:
    assert BUILTIN == [
        "arithmetic",
        "calculator",
        "calculator-agent",
        "code",
        "code-fix",
        "frozenlake",
        "gsm8k",
        "guess-number",
        "repo-repair",
        "setter-solver",
        "tic-tac-toe",
        "wordle",
    ]
    assert WITH_REFERENCE == [
        "arithmetic",
        "calculator",
        "calculator-agent",
        "code",
        "code-fix",
        "frozenlake",
        "guess-number",
        "repo-repair",
        "wordle",
    ]


@pytest.mark.parametrize("name", BUILTIN)
def test_builtin_env_passes_check_env(name: str) -> None:
    report = check_env(envhub.make(name))
    assert report.passed, report.failures
    expected = (
        "no reference policy declared"
        if name not in WITH_REFERENCE
        else str(envhub.make(name).reward_range[1])
    )
    assert next(r.detail for r in report.results if r.name == "reference policy at top") == expected


@pytest.mark.parametrize("name", BUILTIN)
def test_builtin_env_is_documented(name: str) -> None:
    cls = envhub.list_envs()[name].load()
    assert cls.name == name and cls.version == "0.1.0"
    assert cls.__doc__ and "Args:" in cls.__doc__


@pytest.mark.parametrize("name", WITH_REFERENCE)
def test_reference_policy_wins_through_the_rollout_runner(name: str) -> None:
    with envhub.make(name) as env:
        policy, top = env.reference_policy, env.reward_range[1]
    engine = ScriptedEngine(policy, ByteChatTokenizer())
    runner = RolloutRunner(engine, lambda: envhub.make(name), max_concurrency=4, seed=0)
    trajectories = asyncio.run(runner.run([0, 1, 2, 3], samples_per_task=2))
    assert len(trajectories) == 8
    for traj in trajectories:
        assert traj.errors == []
        assert traj.reward == top
        assert (traj.terminated, traj.truncated, traj.stop_reason) == (True, False, "terminated")
        assert traj.token_ids is not None and traj.token_drift == []
        assert sum(traj.loss_mask) == sum(t.completion_tokens for t in traj.turns) > 0
    for first, second in zip(trajectories[::2], trajectories[1::2], strict=True):
        # Samples of one group differ in seed but share the task, so a deterministic policy
        # plays the very same episode.
        assert first.seed != second.seed
        assert first.messages == second.messages
