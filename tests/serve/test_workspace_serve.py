"""``envhub serve repo-repair``: a remote client plays episodes whose sandbox sessions live on
the server, and the server's verifier scores them as the local env does."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

import envhub
from envhub.envs.repo_repair import RepoRepairEnv
from envhub.sandbox import bwrap_problem
from envhub.types import assistant

pytestmark = pytest.mark.skipif(
    bwrap_problem() is not None or os.geteuid() != 0,
    reason="local sessions need bubblewrap and root",
)


def play(env: Any, index: int, policy: Callable[..., str]) -> tuple[float, dict[str, Any]]:
    observation, _ = env.reset(seed=0, options={"task_index": index})
    messages = list(observation)
    while True:
        action = policy(messages, env.tool_schemas)
        observation, reward, terminated, truncated, info = env.step(action)
        messages += [assistant(action), *observation]
        if terminated or truncated:
            return reward, info


def test_a_served_repo_repair_scores_like_the_local_one(serve: Callable[..., Any]) -> None:
    server = serve("repo-repair")
    local = RepoRepairEnv(seeds=(0,), difficulties=(1, 3))
    remote = envhub.make(server.url(), seeds=[0], difficulties=[1, 3])
    assert remote.tool_schemas == local.tool_schemas
    for index in (0, 1):
        reward, info = play(remote, index, local.reference_policy)
        assert reward == 1.0 and info["reward_components"]["tests_passed"] == 1.0
        assert play(remote, index, lambda m, t: "nothing")[0] == 0.0
    remote.close()
    local.close()
