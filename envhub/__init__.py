"""envhub: write, check, share and train on multi-turn LLM environments.

The public API is re-exported here and loaded on first use, so ``import envhub`` is cheap and
never imports torch, vLLM or transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from envhub.version import __version__  # noqa: F401 - envhub.__version__

_EXPORTS = {
    # environments
    "Env": "envhub.env",
    "TaskEnv": "envhub.env",
    "SingleTurnEnv": "envhub.env",
    "State": "envhub.state",
    "RequiredField": "envhub.rows",
    "MultiTurnEnv": "envhub.multiturn",
    "ToolEnv": "envhub.multiturn",
    "HarnessEnv": "envhub.harness.env",
    "MultiRoleEnv": "envhub.roles",
    "Match": "envhub.roles",
    # messages and trajectories
    "Message": "envhub.types",
    "ToolCall": "envhub.types",
    "AssistantTurn": "envhub.types",
    "Trajectory": "envhub.types",
    # tools and rewards
    "tool": "envhub.tools.tool",
    "Tool": "envhub.tools.tool",
    "Injected": "envhub.tools.tool",
    "Rubric": "envhub.rewards.rubric",
    "reward": "envhub.rewards.rubric",
    "group_reward": "envhub.rewards.rubric",
    # registry, checker, rollouts
    "make": "envhub.loader",
    "register": "envhub.registry",
    "list_envs": "envhub.registry",
    "check_env": "envhub.checks.checker",
    "audit_env": "envhub.audit",
    "RolloutRunner": "envhub.rollout.runner",
    "evaluate": "envhub.evaluation",
    "train": "envhub.trainer.api",  # by name only: not imported here, even for type checkers
    "InferenceEngine": "envhub.inference.base",
    "SamplingParams": "envhub.inference.base",
    "OpenAIEngine": "envhub.inference.openai_http",
}

__all__ = [
    "AssistantTurn",
    "Env",
    "HarnessEnv",
    "InferenceEngine",
    "Injected",
    "Match",
    "Message",
    "MultiRoleEnv",
    "MultiTurnEnv",
    "OpenAIEngine",
    "RequiredField",
    "RolloutRunner",
    "Rubric",
    "SamplingParams",
    "SingleTurnEnv",
    "State",
    "TaskEnv",
    "Tool",
    "ToolCall",
    "ToolEnv",
    "Trajectory",
    "audit_env",
    "check_env",
    "evaluate",
    "group_reward",
    "list_envs",
    "make",
    "register",
    "reward",
    "tool",
    "train",
]

if TYPE_CHECKING:
    from envhub.audit import audit_env
    from envhub.checks.checker import check_env
    from envhub.env import Env, SingleTurnEnv, TaskEnv
    from envhub.harness.env import HarnessEnv
    from envhub.inference.base import InferenceEngine, SamplingParams
    from envhub.inference.openai_http import OpenAIEngine
    from envhub.loader import make
    from envhub.multiturn import MultiTurnEnv, ToolEnv
    from envhub.registry import list_envs, register
    from envhub.rewards.rubric import Rubric, group_reward, reward
    from envhub.roles import Match, MultiRoleEnv
    from envhub.rollout.runner import RolloutRunner
    from envhub.rows import RequiredField
    from envhub.state import State
    from envhub.tools.tool import Injected, Tool, tool
    from envhub.types import AssistantTurn, Message, ToolCall, Trajectory


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'envhub' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


# gymnasium ids `envhub/<name>`: registered now if gymnasium is loaded, else when it is.
importlib.import_module("envhub._gymnasium_hook").install()
